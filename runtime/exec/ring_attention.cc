// Ring attention (context parallelism), composed by the executor: the
// sequence's blocks rearranged for causal balance, key/value blocks (and,
// backward, their gradients) passed around the cp ranks while each block pair
// runs on the device's attention-block kernels, the rows merged by the
// online-softmax rule; packed documents skip the pairs no row's document reaches.

#include "runtime/exec/executor.h"
#include "runtime/device/kernel_launch.h"
#include "runtime/plan/plan_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ptc {

using plan::OpCode;

Status Executor::runRingAttention(const plan::Instruction &inst) {
  // Rank r of the axis' n holds block r of the sequence. For causal balance
  // (every rank the same work) the blocks are first rearranged in halves:
  // with the sequence in 2n halves, rank r works on halves r and 2n-1-r
  // (each rank's contiguous block is halves 2r and 2r+1), held half-major
  // ([2][batch, heads, half, dim]). Step s of the ring: the key/value halves
  // of rank (r - s) mod n are here; each query half sees the key halves
  // before it whole and its own causally, merged by the online-softmax rule;
  // then every rank's key/value halves move one rank on. The gradient runs
  // the ring twice: once for the rows' statistics (o, log-sum-exp), once with
  // the halves' dk, dv travelling along, which a last move brings home; the
  // results go back to the contiguous blocks. Given the forward's result and
  // statistics (ptc-save-attention-stats: the forward's second output), the
  // gradient reads them and runs the second ring only.
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  const bool grad = inst.op() == OpCode::RingAttentionGrad;
  const TensorInfo &qt = plan_->tensor(in[0]), &kt = plan_->tensor(in[1]);
  const int axis = static_cast<int>(plan::attrOf(inst, kernels::attr::RingAttention::axis));
  const double scale = plan::attrOf(inst, kernels::attr::RingAttention::scale);
  const int n = plan_->meshSizes()[static_cast<size_t>(axis)];
  const int r = coords()[static_cast<size_t>(axis)];
  const std::string what = std::string("ring attention at ") +
                           (inst.location() ? inst.location()->c_str() : "");
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  struct Timed { // the instruction's whole time, however it returns
    RingProfile &p;
    Clock::time_point t0 = Clock::now();
    ~Timed() {
      ++p.instructions;
      p.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    }
  } timed{ringProfile_};
  if (n > 1 && !comm_)
    return error(StatusCode::kInternal, what, ": the plan's mesh axis has ", n,
                 " ranks but no communicator");
  const int64_t block = qt.shape[2];
  // Halves when the block splits in two (else whole blocks, unbalanced).
  const int parts = n > 1 && block % 2 == 0 ? 2 : 1;
  const int64_t len = block / parts; // rows of one part
  const int64_t batch = qt.shape[0], heads = qt.shape[1], kvHeads = kt.shape[1],
                dim = qt.shape[3];
  const Shape partShape{batch, heads, len, dim}, kvShape{batch, kvHeads, len, dim},
      rowShape{batch, heads, len};
  const int64_t qPart = batch * heads * len * dim, kvPart = batch * kvHeads * len * dim;
  // f32 throughout (low-precision tensors arrive widened: runWidened).
  const int64_t qBytes = qt.numElements * 4, kvBytes = kt.numElements * 4,
                rows = batch * heads * block;
  const int64_t rowBytes = rows * 4, rowsPart = batch * heads * len;
  Device &d = *dev_;
  // The sequence part a rank's slot holds: contiguous block r is parts
  // (parts*r, parts*r+1); the balanced layout puts parts r and 2n-1-r here.
  auto heldPart = [&](int rank, int slot) { return parts == 1 ? rank : slot == 0 ? rank : 2 * n - 1 - rank; };

  // Host staging for moves between layouts and ranks.
  std::vector<float> hostA, hostB;
  // Contiguous [b, h, block, d] (device) <-> balanced half-major (device).
  // `heads_` is the tensor's head count; `toBalanced` picks the direction.
  // `width`: elements per row (the head dim; 1 for the document positions).
  auto rearrange = [&](const float *src, float *dst, int64_t headCount, bool toBalanced,
                       int tagBase, int64_t width) -> Status {
    const int64_t elems = batch * headCount * block * width, partElems = elems / parts;
    const int64_t bytes = elems * 4;
    if (parts == 1)
      return d.copy(dst, src, bytes, CopyKind::DeviceToDevice);
    // Host memory devices are read and written in place; others through
    // host copies.
    const bool inPlace = d.hostAddressable();
    const float *from = src;
    float *to = dst;
    if (!inPlace) {
      hostA.resize(static_cast<size_t>(elems));
      hostB.resize(static_cast<size_t>(elems));
      PTC_RETURN_IF_ERROR(d.copy(hostA.data(), src, bytes, CopyKind::DeviceToHost));
      from = hostA.data();
      to = hostB.data();
    }
    std::vector<float> message(static_cast<size_t>(partElems));
    // The rows of part `slot` of the contiguous block, packed.
    auto pack = [&](const float *in, int slot, float *out) {
      for (int64_t bh = 0; bh < batch * headCount; ++bh)
        std::memcpy(out + bh * len * width, in + (bh * block + slot * len) * width,
                    static_cast<size_t>(len * width) * 4);
    };
    auto unpack = [&](const float *in, int slot, float *out) {
      for (int64_t bh = 0; bh < batch * headCount; ++bh)
        std::memcpy(out + (bh * block + slot * len) * width, in + bh * len * width,
                    static_cast<size_t>(len * width) * 4);
    };
    for (int slot = 0; slot < 2; ++slot) {
      // The global part this slot holds, and where it goes (the balanced
      // layout is half-major: each part is contiguous there).
      int part, peer, peerSlot;
      const float *out = message.data();
      if (toBalanced) {
        part = 2 * r + slot;
        peer = part < n ? part : 2 * n - 1 - part;
        peerSlot = part < n ? 0 : 1;
        pack(from, slot, message.data());
      } else {
        part = heldPart(r, slot);
        peer = part / 2;
        peerSlot = part % 2;
        out = from + slot * partElems;
      }
      PTC_RETURN_IF_ERROR(comm_->send(out, partElems * 4, axis, peer, tagBase + peerSlot, what));
    }
    for (int slot = 0; slot < 2; ++slot) {
      int part = toBalanced ? heldPart(r, slot) : 2 * r + slot;
      int peer = toBalanced ? part / 2 : (part < n ? part : 2 * n - 1 - part);
      if (toBalanced) {
        PTC_RETURN_IF_ERROR(comm_->recv(to + slot * partElems, partElems * 4, axis, peer,
                                        tagBase + slot, what));
      } else {
        PTC_RETURN_IF_ERROR(comm_->recv(message.data(), partElems * 4, axis, peer, tagBase + slot, what));
        unpack(message.data(), slot, to);
      }
    }
    return inPlace ? Status::ok() : d.copy(dst, hostB.data(), bytes, CopyKind::HostToDevice);
  };

  // The forward's saved result and statistics (the gradient's inputs 4 and
  // 5), the forward's statistics output; packed documents: the block's
  // positions (the input after the float ones).
  const auto kind = static_cast<kernels::OpKind>(inst.op());
  const bool saved = kernels::hasSavedAttentionStats(kind, in.size());
  const size_t savedAt = kernels::attentionBaseInputs(kind);
  const bool returnsStats = !grad && out.size() > 1;
  const size_t positionsInput = kernels::attentionFloatInputs(kind, in.size());
  const bool documents = in.size() > positionsInput;
  const int64_t positionBytes = batch * block * 4, firstKeyBytes = batch * len * 4;
  // q, (g), acc, o, dq | row max, sum, lse | k, v x2 | dk, dv x2 | balanced k, v copies
  // | (documents) balanced positions, a pair's first keys
  const int64_t total = (grad ? 5 : 3) * qBytes + 3 * rowBytes + (grad ? 10 : 6) * kvBytes +
                        (documents ? positionBytes + firstKeyBytes : 0);
  PTC_RETURN_IF_ERROR(ringScratch_.reserve(total));
  auto *base = static_cast<uint8_t *>(ringScratch_.data());
  auto carve = [&](int64_t bytes) {
    float *p = reinterpret_cast<float *>(base);
    base += bytes;
    return p;
  };
  float *q = carve(qBytes), *acc = carve(qBytes), *o = carve(qBytes);
  float *g = grad ? carve(qBytes) : nullptr, *dq = grad ? carve(qBytes) : nullptr;
  float *mx = carve(rowBytes), *sum = carve(rowBytes), *lse = carve(rowBytes);
  // Each key/value pair is carved one after the other: the ring moves a pair at once.
  float *kv[2][2] = {{carve(kvBytes), carve(kvBytes)}, {carve(kvBytes), carve(kvBytes)}};
  float *home[2] = {carve(kvBytes), carve(kvBytes)};
  float *dkv[2][2] = {{nullptr, nullptr}, {nullptr, nullptr}};
  if (grad)
    for (auto &pair : dkv)
      pair[0] = carve(kvBytes), pair[1] = carve(kvBytes);
  float *positionsBalanced = documents ? carve(positionBytes) : nullptr;
  auto *firstKeys = documents ? reinterpret_cast<int32_t *>(carve(firstKeyBytes)) : nullptr;
  // Moving a key/value pair (carved one after the other: 2 x kvBytes from
  // `pair`) one rank on along the ring into `into`, in two halves so that the
  // transfer overlaps the step's compute: `post` sends (the communicator
  // copies the data and returns at once), `finish` receives. A
  // device-resident communicator (NCCL) instead runs the step's send/recv on
  // the communication stream after the compute that produced the blocks, and
  // `finish` makes the compute that reads them wait for it.
  const int64_t pairBytes = 2 * kvBytes;
  const bool onDevice = n > 1 && commOnDevice();
  std::map<int, Event> shifted; // tag -> the communication stream's event
  auto post = [&](float *pair, float *into, int tag) -> Status {
    const Clock::time_point t0 = Clock::now();
    if (onDevice) {
      PTC_RETURN_IF_ERROR(enterComm());
      PTC_RETURN_IF_ERROR(comm_->ringShift(pair, into, pairBytes, axis, tag, what));
      auto ev = d.record(StreamKind::Communication);
      if (!ev.isOk())
        return ev.status();
      shifted[tag] = *ev;
    } else {
      auto view = commView(pair, pairBytes, 0, /*load=*/true);
      if (!view.isOk())
        return view.status();
      PTC_RETURN_IF_ERROR(comm_->send(*view, pairBytes, axis, (r + 1) % n, tag, what));
    }
    ringProfile_.bytes += static_cast<double>(pairBytes);
    ringProfile_.transferSeconds += since(t0);
    return Status::ok();
  };
  auto finish = [&](float *into, int tag) -> Status {
    const Clock::time_point t0 = Clock::now();
    if (onDevice) {
      PTC_RETURN_IF_ERROR(d.wait(StreamKind::Compute, shifted.at(tag)));
      shifted.erase(tag);
    } else {
      auto view = commView(into, pairBytes, 1, /*load=*/false);
      if (!view.isOk())
        return view.status();
      PTC_RETURN_IF_ERROR(comm_->recv(*view, pairBytes, axis, (r + n - 1) % n, tag, what));
      PTC_RETURN_IF_ERROR(commWriteBack(into, *view, pairBytes));
    }
    ringProfile_.transferSeconds += since(t0);
    return Status::ok();
  };
  auto move = [&](float *pair, float *into, int tag) -> Status {
    PTC_RETURN_IF_ERROR(post(pair, into, tag));
    return finish(into, tag);
  };
  double flopsWeight = 1.0; // the gradient's blocks count 2.5x the forward's
  // One block's kernel call (kernel_call.h's AttentionBlock(Grad)): query
  // part a against key/value part b of ring buffer `cur`, the op's other
  // operands, then the rows' first keys (packed documents).
  auto blockCall = [&](kernels::OpKind op, int a, int b, int cur) {
    KernelLaunch call(op);
    call.in(q + a * qPart, partShape)
        .in(kv[cur][0] + b * kvPart, kvShape)
        .in(kv[cur][1] + b * kvPart, kvShape);
    return call;
  };
  auto launchBlock = [&](KernelLaunch &call, bool causal, const int32_t *keysFrom) {
    if (keysFrom)
      call.in(keysFrom, {batch, len}, kernels::DType::I32);
    return call.set(kernels::attr::AttentionBlock::causal, causal ? 1 : 0)
        .set(kernels::attr::AttentionBlock::storage, static_cast<int>(qt.dtype))
        .set(kernels::attr::AttentionBlock::scale, scale)
        .launch(d);
  };
  // Packed documents: the global index of each held query row's document
  // start ([slot][batch][len]), from the positions in the balanced layout.
  std::vector<int64_t> documentStart;
  std::vector<int32_t> hostFirstKeys;
  if (documents) {
    // The positions move like a [batch, 1, block, 1] tensor (4-byte elements).
    PTC_RETURN_IF_ERROR(rearrange(reinterpret_cast<const float *>(data(in[positionsInput])),
                                  positionsBalanced, 1, true, 9016, 1));
    std::vector<int32_t> held(static_cast<size_t>(batch * block));
    PTC_RETURN_IF_ERROR(d.copy(held.data(), positionsBalanced, positionBytes, CopyKind::DeviceToHost));
    documentStart.resize(held.size());
    for (int a = 0; a < parts; ++a)
      for (int64_t bt = 0; bt < batch; ++bt)
        for (int64_t t = 0; t < len; ++t) {
          const size_t at = static_cast<size_t>((a * batch + bt) * len + t);
          const int64_t global = heldPart(r, a) * len + t;
          if (held[at] < 0 || held[at] > global)
            return error(StatusCode::kInvalidArgument, what, ": document position ", held[at],
                         " of token ", global, " (batch entry ", bt, ") is outside [0, ", global,
                         "]");
          documentStart[at] = global - held[at];
        }
    hostFirstKeys.resize(static_cast<size_t>(batch * len));
  }
  // Every (query part, key part) pair a ring step holds: `fn(qSlot, kSlot, causal,
  // firstKeys)` for the pairs the causal (and document) mask does not hide whole.
  auto pairs = [&](int src, const std::function<Status(int, int, bool, const int32_t *)> &fn)
      -> Status {
    const Clock::time_point t0 = Clock::now();
    for (int a = 0; a < parts; ++a)
      for (int b = 0; b < parts; ++b) {
        int qPartIndex = heldPart(r, a), kPartIndex = heldPart(src, b);
        if (kPartIndex > qPartIndex)
          continue;
        const bool diagonal = kPartIndex == qPartIndex;
        double visible = diagonal ? 0.5 * static_cast<double>(len) * static_cast<double>(len + 1)
                                  : static_cast<double>(len) * static_cast<double>(len);
        const int32_t *keysFrom = nullptr;
        if (documents) {
          // Each row's first key in this key part; the pair is skipped when
          // every row's document starts after it.
          const int64_t keyOffset = kPartIndex * len;
          visible = 0;
          for (int64_t bt = 0; bt < batch; ++bt)
            for (int64_t t = 0; t < len; ++t) {
              const int64_t start =
                  documentStart[static_cast<size_t>((a * batch + bt) * len + t)] - keyOffset;
              const int64_t first = std::clamp<int64_t>(start, 0, len);
              const int64_t end = diagonal ? t + 1 : len;
              hostFirstKeys[static_cast<size_t>(bt * len + t)] = static_cast<int32_t>(first);
              visible += static_cast<double>(std::max<int64_t>(end - first, 0));
            }
          visible /= static_cast<double>(batch); // per batch entry, as the count above
          if (visible == 0)
            continue;
          PTC_RETURN_IF_ERROR(d.copy(firstKeys, hostFirstKeys.data(), firstKeyBytes,
                                     CopyKind::HostToDevice));
          keysFrom = firstKeys;
        }
        ringProfile_.flops += flopsWeight * 4.0 * static_cast<double>(batch * heads * dim) * visible;
        PTC_RETURN_IF_ERROR(fn(a, b, diagonal, keysFrom));
      }
    ringProfile_.computeSeconds += since(t0);
    return Status::ok();
  };

  PTC_RETURN_IF_ERROR(rearrange(f32(in[0]), q, heads, true, 9000, dim));
  PTC_RETURN_IF_ERROR(rearrange(f32(in[1]), home[0], kvHeads, true, 9002, dim));
  PTC_RETURN_IF_ERROR(rearrange(f32(in[2]), home[1], kvHeads, true, 9004, dim));
  if (saved) {
    // The forward's o and log-sum-exp, moved like q (the statistics as rows of width 1).
    PTC_RETURN_IF_ERROR(rearrange(f32(in[savedAt]), o, heads, true, 9018, dim));
    PTC_RETURN_IF_ERROR(rearrange(f32(in[savedAt + 1]), lse, heads, true, 9020, 1));
  } else {
    // Forward: the rows' online softmax over the parts they see.
    PTC_RETURN_IF_ERROR(d.zero(acc, qBytes));
    PTC_RETURN_IF_ERROR(d.zero(sum, rowBytes));
    std::vector<float> minusInf(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
    PTC_RETURN_IF_ERROR(d.copy(mx, minusInf.data(), rowBytes, CopyKind::HostToDevice));
    PTC_RETURN_IF_ERROR(d.copy(kv[0][0], home[0], kvBytes, CopyKind::DeviceToDevice));
    PTC_RETURN_IF_ERROR(d.copy(kv[0][1], home[1], kvBytes, CopyKind::DeviceToDevice));
    for (int s = 0, cur = 0; s < n; ++s, cur ^= 1) {
      const int src = (r - s + n) % n;
      if (s + 1 < n) // on its way while this step computes
        PTC_RETURN_IF_ERROR(post(kv[cur][0], kv[cur ^ 1][0], 9100 + s));
      if (s + 1 < n && ringSerial_)
        PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9100 + s));
      PTC_RETURN_IF_ERROR(pairs(src, [&](int a, int b, bool causal, const int32_t *keysFrom) {
        KernelLaunch call = blockCall(kernels::OpKind::AttentionBlock, a, b, cur);
        call.out(acc + a * qPart, partShape)
            .out(mx + a * rowsPart, rowShape)
            .out(sum + a * rowsPart, rowShape);
        return launchBlock(call, causal, keysFrom);
      }));
      if (s + 1 < n && !ringSerial_)
        PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9100 + s));
    }
    // o = acc / sum, lse = max + log(sum): rows of the host copies.
    std::vector<float> hAcc(static_cast<size_t>(rows * dim)), hMx(static_cast<size_t>(rows)),
        hSum(static_cast<size_t>(rows));
    PTC_RETURN_IF_ERROR(d.copy(hAcc.data(), acc, qBytes, CopyKind::DeviceToHost));
    PTC_RETURN_IF_ERROR(d.copy(hMx.data(), mx, rowBytes, CopyKind::DeviceToHost));
    PTC_RETURN_IF_ERROR(d.copy(hSum.data(), sum, rowBytes, CopyKind::DeviceToHost));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < dim; ++c)
        hAcc[static_cast<size_t>(i * dim + c)] /= hSum[static_cast<size_t>(i)];
      hMx[static_cast<size_t>(i)] += std::log(hSum[static_cast<size_t>(i)]);
    }
    PTC_RETURN_IF_ERROR(d.copy(o, hAcc.data(), qBytes, CopyKind::HostToDevice));
    PTC_RETURN_IF_ERROR(d.copy(lse, hMx.data(), rowBytes, CopyKind::HostToDevice));
  }
  if (!grad) {
    PTC_RETURN_IF_ERROR(rearrange(o, f32(out[0]), heads, false, 9006, dim));
    if (returnsStats)
      PTC_RETURN_IF_ERROR(rearrange(lse, f32(out[1]), heads, false, 9022, 1));
    return n > 1 ? comm_->flushSends() : Status::ok();
  }
  // Backward: dq here; each part's dk, dv travel with it.
  flopsWeight = 2.5;
  PTC_RETURN_IF_ERROR(rearrange(f32(in[3]), g, heads, true, 9008, dim));
  PTC_RETURN_IF_ERROR(d.zero(dq, qBytes));
  PTC_RETURN_IF_ERROR(d.copy(kv[0][0], home[0], kvBytes, CopyKind::DeviceToDevice));
  PTC_RETURN_IF_ERROR(d.copy(kv[0][1], home[1], kvBytes, CopyKind::DeviceToDevice));
  PTC_RETURN_IF_ERROR(d.zero(dkv[0][0], kvBytes));
  PTC_RETURN_IF_ERROR(d.zero(dkv[0][1], kvBytes));
  int cur = 0;
  for (int s = 0; s < n; ++s) {
    const int src = (r - s + n) % n;
    // The keys and values leave before this step's compute; their gradients
    // (which it adds to) after it.
    if (s + 1 < n)
      PTC_RETURN_IF_ERROR(post(kv[cur][0], kv[cur ^ 1][0], 9200 + s));
    if (s + 1 < n && ringSerial_)
      PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9200 + s));
    PTC_RETURN_IF_ERROR(pairs(src, [&](int a, int b, bool causal, const int32_t *keysFrom) {
      KernelLaunch call = blockCall(kernels::OpKind::AttentionBlockGrad, a, b, cur);
      call.in(o + a * qPart, partShape)
          .in(g + a * qPart, partShape)
          .in(lse + a * rowsPart, rowShape)
          .out(dq + a * qPart, partShape)
          .out(dkv[cur][0] + b * kvPart, kvShape)
          .out(dkv[cur][1] + b * kvPart, kvShape);
      return launchBlock(call, causal, keysFrom);
    }));
    if (s + 1 < n) {
      PTC_RETURN_IF_ERROR(post(dkv[cur][0], dkv[cur ^ 1][0], 9250 + s));
      if (!ringSerial_)
        PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9200 + s));
      PTC_RETURN_IF_ERROR(finish(dkv[cur ^ 1][0], 9250 + s));
      cur ^= 1;
    }
  }
  // Here: the gradients of rank r + 1's parts; one more move brings every part home.
  if (n > 1)
    PTC_RETURN_IF_ERROR(move(dkv[cur][0], home[0], 9300));
  else {
    PTC_RETURN_IF_ERROR(d.copy(home[0], dkv[cur][0], kvBytes, CopyKind::DeviceToDevice));
    PTC_RETURN_IF_ERROR(d.copy(home[1], dkv[cur][1], kvBytes, CopyKind::DeviceToDevice));
  }
  PTC_RETURN_IF_ERROR(rearrange(dq, f32(out[0]), heads, false, 9010, dim));
  PTC_RETURN_IF_ERROR(rearrange(home[0], f32(out[1]), kvHeads, false, 9012, dim));
  PTC_RETURN_IF_ERROR(rearrange(home[1], f32(out[2]), kvHeads, false, 9014, dim));
  return n > 1 ? comm_->flushSends() : Status::ok();
}

} // namespace ptc
