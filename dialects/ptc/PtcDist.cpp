//===- PtcDist.cpp - mesh attribute, sharding specs, collective verifiers -===//

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcSharding.h"

#include "runtime/base/mesh_text.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ptc;

int64_t MeshInfo::numDevices() const {
  int64_t n = 1;
  for (int64_t s : sizes)
    n *= s;
  return n;
}

ArrayRef<MeshAxisKind> mlir::ptc::meshAxisKinds() {
  static const MeshAxisKind kinds[] = {
      {MeshAxisRole::Data, "dp", "data parallelism, ZeRO", true},
      {MeshAxisRole::Tensor, "tp", "tensor and sequence parallelism", true},
      {MeshAxisRole::Pipeline, "pp", "pipeline parallelism", true},
      {MeshAxisRole::Expert, "ep", "expert parallelism", true},
      {MeshAxisRole::Context, "cp", "context parallelism", true},
  };
  return kinds;
}

const MeshAxisKind *mlir::ptc::lookupMeshAxisKind(StringRef name) {
  for (const MeshAxisKind &k : meshAxisKinds())
    if (k.name == name)
      return &k;
  return nullptr;
}

StringRef mlir::ptc::meshAxisName(MeshAxisRole role) {
  for (const MeshAxisKind &k : meshAxisKinds())
    if (k.role == role)
      return k.name;
  llvm_unreachable("every role has an axis kind");
}

SmallVector<int, 2> MeshInfo::parts(int a) const {
  if (a < 0)
    return {};
  if (a < static_cast<int>(axes.size()))
    return {a};
  return compounds[static_cast<size_t>(a) - axes.size()];
}

int64_t MeshInfo::size(int a) const {
  int64_t n = 1;
  for (int p : parts(a))
    n *= sizes[static_cast<size_t>(p)];
  return n;
}

std::string MeshInfo::name(int a) const {
  std::string out;
  for (int p : parts(a))
    out += (out.empty() ? "" : "*") + axes[static_cast<size_t>(p)];
  return out;
}

bool MeshInfo::overlaps(int a, int b) const {
  SmallVector<int, 2> pb = parts(b);
  return llvm::any_of(parts(a), [&](int p) { return llvm::is_contained(pb, p); });
}

int MeshInfo::axisOf(ArrayRef<int> ps) const {
  if (ps.empty())
    return -1;
  if (ps.size() == 1)
    return ps[0];
  for (auto [i, c] : llvm::enumerate(compounds))
    if (ArrayRef<int>(c) == ps)
      return static_cast<int>(axes.size() + i);
  return -1;
}

int MeshInfo::batchAxis() const {
  int dp = axisIndex(MeshAxisRole::Data), ep = axisIndex(MeshAxisRole::Expert);
  bool hasDp = dp >= 0 && sizes[static_cast<size_t>(dp)] > 1;
  bool hasEp = ep >= 0 && sizes[static_cast<size_t>(ep)] > 1;
  if (hasDp && hasEp)
    return axisOf({dp, ep});
  return hasDp ? dp : hasEp ? ep : -1;
}

int MeshInfo::axisIndex(StringRef name) const {
  for (auto [i, a] : llvm::enumerate(axes))
    if (a == name)
      return static_cast<int>(i);
  return -1;
}

DictionaryAttr MeshInfo::toAttr(MLIRContext *context) const {
  Builder b(context);
  SmallVector<StringRef> names(axes.begin(), axes.end());
  return b.getDictionaryAttr({b.getNamedAttr("axes", b.getStrArrayAttr(names)),
                              b.getNamedAttr("shape", b.getDenseI64ArrayAttr(sizes))});
}

namespace {
LogicalResult checkMesh(const MeshInfo &mesh, EmitErrorFn emitError) {
  if (mesh.axes.empty())
    return emitError() << "the mesh needs at least one axis";
  llvm::StringSet<> seen;
  for (auto [name, size] : llvm::zip(mesh.axes, mesh.sizes)) {
    if (name.empty() || name == "_")
      return emitError() << "mesh axis names must be non-empty and not '_'";
    if (!seen.insert(name).second)
      return emitError() << "mesh axis '" << name << "' appears twice";
    const MeshAxisKind *kind = lookupMeshAxisKind(name);
    if (!kind) {
      InFlightDiagnostic diag = emitError();
      diag << "unknown mesh axis '" << name << "'; known axes: ";
      llvm::interleaveComma(meshAxisKinds(), diag, [&](const MeshAxisKind &k) {
        diag << k.name << " (" << k.description << (k.implemented ? "" : ", not implemented yet")
             << ")";
      });
      return diag;
    }
    if (!kind->implemented && size > 1)
      return emitError() << "mesh axis '" << name << "' (" << kind->description
                         << ") is not implemented yet: every rank would hold a full replica";
    if (size < 1)
      return emitError() << "mesh axis '" << name << "' has size " << size
                         << "; sizes must be at least 1";
  }
  return success();
}

/// The compound axes a mesh needs: dp*ep when it has both (the batch of
/// expert parallelism carved out of data parallelism; ep minor, so that an
/// all_to_all over ep moves a dimension from dp*ep to dp), tp*cp, cp*tp and
/// dp*cp.
void addCompounds(MeshInfo &mesh) {
  auto split = [&](MeshAxisRole role) {
    int a = mesh.axisIndex(role);
    return a >= 0 && mesh.sizes[static_cast<size_t>(a)] > 1 ? a : -1;
  };
  int dp = split(MeshAxisRole::Data), ep = split(MeshAxisRole::Expert);
  if (dp >= 0 && ep >= 0)
    mesh.compounds.push_back({dp, ep});
  // tp*cp: context parallelism's attention (Ulysses) splits heads that tp
  // already splits over cp too (cp minor: an all_to_all over cp moves the
  // split between the sequence and the heads).
  int tp = split(MeshAxisRole::Tensor), cp = split(MeshAxisRole::Context);
  if (tp >= 0 && cp >= 0)
    mesh.compounds.push_back({tp, cp});
  // cp*tp: sequence parallelism inside context parallelism splits each cp
  // rank's chunk of the sequence over tp (tp minor: gathering over tp before
  // a column-parallel projection leaves the cp chunk).
  if (tp >= 0 && cp >= 0)
    mesh.compounds.push_back({cp, tp});
  // dp*cp: a batch of one sequence per dp rank, flattened with its sequence
  // (the weight gradients' [batch * seq] rows under context parallelism).
  if (dp >= 0 && cp >= 0)
    mesh.compounds.push_back({dp, cp});
}
} // namespace

FailureOr<MeshInfo> mlir::ptc::parseMeshSpec(StringRef spec, EmitErrorFn emitError) {
  ::ptc::StatusOr<::ptc::MeshText> text =
      ::ptc::parseMeshText(std::string_view(spec.data(), spec.size()));
  if (!text.isOk()) {
    emitError() << text.status().message();
    return failure();
  }
  MeshInfo mesh;
  for (const ::ptc::MeshAxisText &axis : text->axes) {
    mesh.axes.push_back(axis.name);
    mesh.sizes.push_back(axis.size);
  }
  if (failed(checkMesh(mesh, emitError)))
    return failure();
  addCompounds(mesh);
  return mesh;
}

FailureOr<MeshInfo> mlir::ptc::parseMeshAttr(Attribute attr, EmitErrorFn emitError) {
  auto dict = dyn_cast<DictionaryAttr>(attr);
  auto axes = dict ? dict.getAs<ArrayAttr>("axes") : ArrayAttr();
  auto shape = dict ? dict.getAs<DenseI64ArrayAttr>("shape") : DenseI64ArrayAttr();
  if (!axes || !shape || static_cast<int64_t>(axes.size()) != shape.size() ||
      !llvm::all_of(axes, [](Attribute a) { return isa<StringAttr>(a); })) {
    emitError() << "'ptc.mesh' must be {axes = [names...], shape = array<i64: sizes...>} "
                   "with one size per axis";
    return failure();
  }
  MeshInfo mesh;
  for (Attribute a : axes)
    mesh.axes.push_back(cast<StringAttr>(a).str());
  mesh.sizes.assign(shape.asArrayRef().begin(), shape.asArrayRef().end());
  if (failed(checkMesh(mesh, emitError)))
    return failure();
  addCompounds(mesh);
  return mesh;
}

FailureOr<MeshInfo> mlir::ptc::getEnclosingMesh(Operation *op) {
  auto module = isa<ModuleOp>(op) ? cast<ModuleOp>(op) : op->getParentOfType<ModuleOp>();
  Attribute attr = module ? module->getAttr(PtcDialect::kMeshAttrName) : Attribute();
  if (!attr)
    return failure();
  return parseMeshAttr(attr, [&] { return op->emitError(); });
}

namespace {
/// Appends dimension `name` (split in `blocks`) of sharding `text` to `out`:
/// the axis must exist in `mesh` and not split another dimension already.
LogicalResult addSplitDim(Sharding &out, StringRef name, int blocks, StringRef text,
                          const MeshInfo &mesh, EmitErrorFn emitError) {
  // A compound axis ("dp*ep") names its mesh axes, the major one first.
  SmallVector<StringRef, 2> names;
  name.split(names, '*');
  SmallVector<int, 2> parts;
  for (StringRef n : names) {
    int p = mesh.axisIndex(n.trim());
    if (p < 0)
      return emitError() << "sharding " << text << " names '" << n.trim()
                         << "', which is not a mesh axis";
    parts.push_back(p);
  }
  int axis = mesh.axisOf(parts);
  if (axis < 0)
    return emitError() << "sharding " << text << " names '" << name
                       << "', which is not a compound axis of the mesh";
  if (llvm::any_of(out.dims, [&](const DimShard &d) { return d.axis >= 0 && mesh.overlaps(d.axis, axis); }))
    return emitError() << "sharding " << text << " uses mesh axis '" << name << "' twice";
  out.dims.push_back(DimShard(axis, blocks));
  return success();
}
} // namespace

std::string mlir::ptc::shardingText(ShardingAttr attr) {
  std::string text = "[";
  for (auto [i, axis] : llvm::enumerate(attr.getAxes())) {
    text += i ? ", " : "";
    text += axis.getValue().empty() ? std::string("_") : axis.str();
    if (attr.getBlocks()[i] > 1)
      text += "/" + std::to_string(attr.getBlocks()[i]);
  }
  return text + "]";
}

FailureOr<Sharding> mlir::ptc::parseShardingText(StringRef spec, const MeshInfo &mesh,
                                                  int64_t rank, EmitErrorFn emitError) {
  StringRef body = spec.trim();
  if (!body.consume_front("[") || !body.consume_back("]")) {
    emitError() << "sharding \"" << spec << "\" must be written [axis or _, ...]";
    return failure();
  }
  SmallVector<StringRef> parts;
  if (!body.trim().empty())
    body.split(parts, ',');
  if (static_cast<int64_t>(parts.size()) != rank) {
    emitError() << "sharding \"" << spec << "\" has " << parts.size()
                << " entries for a tensor of rank " << rank;
    return failure();
  }
  Sharding out;
  for (StringRef p : parts) {
    p = p.trim();
    if (p == "_") {
      out.dims.push_back(DimShard());
      continue;
    }
    auto [name, blockText] = p.split('/');
    int blocks = 1;
    if (!blockText.empty() && (blockText.trim().getAsInteger(10, blocks) || blocks < 1)) {
      emitError() << "sharding \"" << spec << "\": block count in '" << p
                  << "' must be a positive integer";
      return failure();
    }
    if (failed(addSplitDim(out, name.trim(), blocks, ("\"" + spec + "\"").str(), mesh, emitError)))
      return failure();
  }
  return out;
}

LogicalResult PtcDialect::verifyOperationAttribute(Operation *op, NamedAttribute attr) {
  if (attr.getName() == kMeshAttrName) {
    if (!isa<ModuleOp>(op))
      return op->emitError() << "'ptc.mesh' belongs on the module";
    return parseMeshAttr(attr.getValue(), [&] { return op->emitError(); });
  }
  if (attr.getName() == kShardingAttrName) {
    // A user annotation on an op's results: one spec per result (`unit`:
    // that result is left to propagation).
    auto specs = dyn_cast<ArrayAttr>(attr.getValue());
    if (!specs || specs.size() != op->getNumResults() ||
        !llvm::all_of(specs,
                      [](Attribute a) { return isa<StringAttr, ShardingAttr, UnitAttr>(a); }))
      return op->emitOpError() << "'ptc.sharding' needs one sharding (or `unit`: none) per "
                                  "result, e.g. [#ptc.sharding<[dp, _]>] (or [\"[dp, _]\"])";
    FailureOr<MeshInfo> mesh = getEnclosingMesh(op);
    if (succeeded(mesh))
      for (auto [spec, result] : llvm::zip(specs, op->getResults()))
        if (auto type = dyn_cast<RankedTensorType>(result.getType()); type && !isa<UnitAttr>(spec))
          if (failed(getSharding(spec, *mesh, type.getRank(),
                                 [&] { return op->emitOpError(); })))
            return failure();
    return success();
  }
  return success(); // pass bookkeeping (ptc.offsets, ptc.arena_bytes, ptc.shardings, ...)
}

//===----------------------------------------------------------------------===//
// Collective verifiers
//===----------------------------------------------------------------------===//

namespace {
/// Resolves `axes` against the enclosing mesh; returns the product of their sizes.
FailureOr<int64_t> resolveAxes(Operation *op, ArrayAttr axes, bool single) {
  if (axes.empty() || (single && axes.size() != 1))
    return op->emitOpError() << (single ? "needs exactly one mesh axis" : "needs mesh axes");
  FailureOr<MeshInfo> mesh = getEnclosingMesh(op);
  if (failed(mesh))
    return op->emitOpError() << "needs a 'ptc.mesh' on the enclosing module";
  int64_t size = 1;
  for (Attribute a : axes) {
    int i = mesh->axisIndex(cast<StringAttr>(a).getValue());
    if (i < 0)
      return op->emitOpError() << "axis '" << cast<StringAttr>(a).getValue()
                               << "' is not in the module's mesh";
    size *= mesh->sizes[i];
  }
  return size;
}

LogicalResult verifyBlocked(Operation *op, RankedTensorType whole, RankedTensorType block,
                            int64_t dim, int64_t parts, int64_t blocks) {
  if (whole.getRank() != block.getRank() || dim < 0 || dim >= whole.getRank())
    return op->emitOpError() << "dim " << dim << " is out of range, or the ranks differ";
  if (blocks < 1 || block.getDimSize(dim) % blocks != 0)
    return op->emitOpError() << "blocks = " << blocks << " must divide the local size "
                             << block.getDimSize(dim) << " of dim " << dim;
  for (int64_t d = 0; d < whole.getRank(); ++d) {
    int64_t expected = d == dim ? block.getDimSize(d) * parts : block.getDimSize(d);
    if (whole.getDimSize(d) != expected)
      return op->emitOpError() << "the gathered tensor must be " << parts
                               << " blocks along dim " << dim << " of the local one, got "
                               << whole << " and " << block;
  }
  return success();
}
} // namespace

LogicalResult AllReduceOp::verify() {
  if (getInputs().empty())
    return emitOpError() << "needs at least one operand";
  if (getInputs().getTypes() != getResults().getTypes())
    return emitOpError() << "results must have the operand types";
  return resolveAxes(*this, getAxes(), /*single=*/false);
}

LogicalResult AllGatherOp::verify() {
  FailureOr<int64_t> parts = resolveAxes(*this, getAxes(), /*single=*/true);
  if (failed(parts))
    return failure();
  return verifyBlocked(*this, getType(), getInput().getType(), getDim(), *parts,
                       getBlocksAttr().getInt());
}

LogicalResult ShardSliceOp::verify() {
  FailureOr<int64_t> parts = resolveAxes(*this, getAxes(), /*single=*/true);
  if (failed(parts))
    return failure();
  return verifyBlocked(*this, getInput().getType(), getType(), getDim(), *parts,
                       getBlocksAttr().getInt());
}

LogicalResult ReduceScatterOp::verify() {
  FailureOr<int64_t> parts = resolveAxes(*this, getAxes(), /*single=*/true);
  if (failed(parts))
    return failure();
  return verifyBlocked(*this, getInput().getType(), getType(), getDimAttr().getInt(), *parts, 1);
}

LogicalResult VocabParallelCrossEntropyOp::verify() {
  if (failed(resolveAxes(*this, getAxes(), /*single=*/true)))
    return failure();
  return verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(), getType(),
                                "result", /*f32OverNarrowLogits=*/true);
}

LogicalResult VocabParallelCrossEntropyGradOp::verify() {
  if (failed(resolveAxes(*this, getAxes(), /*single=*/true)))
    return failure();
  return verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(),
                                getGrad().getType(), "grad", /*f32OverNarrowLogits=*/true);
}

LogicalResult VocabParallelCrossEntropyWithGradOp::verify() {
  if (failed(resolveAxes(*this, getAxes(), /*single=*/true)) ||
      failed(verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(),
                                    getLoss().getType(), "loss", /*f32OverNarrowLogits=*/true)))
    return failure();
  return verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(),
                                getGrad().getType(), "grad", /*f32OverNarrowLogits=*/true);
}

/// The mesh axis of a vocabulary-parallel table must exist.
LogicalResult mlir::ptc::verifyVocabAxis(Operation *op, std::optional<StringRef> axis) {
  if (!axis)
    return success();
  FailureOr<MeshInfo> mesh = getEnclosingMesh(op);
  if (failed(mesh))
    return op->emitOpError() << "vocab_axis needs a 'ptc.mesh' on the enclosing module";
  if (mesh->axisIndex(*axis) < 0)
    return op->emitOpError() << "vocab_axis '" << *axis << "' is not in the module's mesh";
  return success();
}

LogicalResult AllToAllOp::verify() {
  FailureOr<int64_t> parts = resolveAxes(*this, getAxes(), /*single=*/true);
  if (failed(parts))
    return failure();
  RankedTensorType in = getInput().getType(), out = getType();
  int64_t split = getSplitDimAttr().getInt(), concat = getConcatDimAttr().getInt();
  if (in.getRank() != out.getRank() || split < 0 || split >= in.getRank() || concat < 0 ||
      concat >= in.getRank() || split == concat)
    return emitOpError() << "split_dim " << split << " and concat_dim " << concat
                         << " must be two different dimensions of the operand";
  for (int64_t d = 0; d < in.getRank(); ++d) {
    int64_t expected = d == concat ? in.getDimSize(d) * *parts
                       : d == split ? in.getDimSize(d) / *parts
                                    : in.getDimSize(d);
    if ((d == split && in.getDimSize(d) % *parts != 0) || out.getDimSize(d) != expected)
      return emitOpError() << "result must be " << *parts << " times larger along concat_dim "
                           << concat << " and " << *parts << " times smaller along split_dim "
                           << split << ", got " << in << " -> " << out;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Pipeline point-to-point
//===----------------------------------------------------------------------===//

namespace {
LogicalResult verifyChannel(Operation *op, int64_t channel, int64_t peer, StringRef peerName) {
  if (channel < 0)
    return op->emitOpError() << "channel must be >= 0, got " << channel;
  if (peer < 0)
    return op->emitOpError() << "'" << peerName << "' must be a chunk index >= 0, got " << peer;
  if (auto stage = op->getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName); stage && stage.getInt() == peer)
    return op->emitOpError() << "sends to its own chunk " << peer;
  return success();
}
} // namespace

LogicalResult TransferOp::verify() {
  if (getDestination() != "host" && getDestination() != "device")
    return emitOpError() << "transfers to \"host\" or \"device\", not \"" << getDestination()
                         << "\"";
  return success();
}

LogicalResult SendOp::verify() { return verifyChannel(*this, getChannel(), getTo(), "to"); }
LogicalResult RecvOp::verify() { return verifyChannel(*this, getChannel(), getFrom(), "from"); }

ShardingAttr mlir::ptc::getShardingAttr(MLIRContext *context, const MeshInfo &mesh,
                                        const Sharding &sharding) {
  SmallVector<StringAttr> names, partialNames;
  SmallVector<int64_t> counts;
  for (const DimShard &d : sharding.dims) {
    names.push_back(StringAttr::get(context, d.axis < 0 ? "" : mesh.name(d.axis)));
    counts.push_back(d.axis < 0 ? 1 : d.blocks);
  }
  for (int a : sharding.partial)
    partialNames.push_back(StringAttr::get(context, mesh.name(a)));
  return ShardingAttr::get(context, names, counts, partialNames);
}

FailureOr<Sharding> mlir::ptc::getSharding(Attribute attr, const MeshInfo &mesh, int64_t rank,
                                           EmitErrorFn emitError) {
  if (auto text = dyn_cast<StringAttr>(attr))
    return parseShardingText(text.getValue(), mesh, rank, emitError);
  auto typed = dyn_cast<ShardingAttr>(attr);
  if (!typed) {
    emitError() << "a sharding must be #ptc.sharding<[axis or _, ...]> (or its text), got "
                << attr;
    return failure();
  }
  std::string text = shardingText(typed);
  if (static_cast<int64_t>(typed.getAxes().size()) != rank) {
    emitError() << "sharding " << text << " has " << typed.getAxes().size()
                << " entries for a tensor of rank " << rank;
    return failure();
  }
  Sharding out;
  for (auto [name, blocks] : llvm::zip(typed.getAxes(), typed.getBlocks())) {
    if (name.getValue().empty()) {
      out.dims.push_back(DimShard());
      continue;
    }
    if (failed(addSplitDim(out, name.getValue(), static_cast<int>(blocks), text, mesh, emitError)))
      return failure();
  }
  for (StringAttr name : typed.getPartial()) {
    Sharding one;
    if (failed(addSplitDim(one, name.getValue(), 1, text, mesh, emitError)))
      return failure();
    addPartial(out.partial, one.dims[0].axis);
  }
  return out;
}

namespace {
/// Ring attention's transfers per call on a ring of `ranks` (the executor's
/// runRingAttention): n - 1 moves of the key and value blocks forward; the
/// gradient runs that ring again unless it has the forward's saved result and
/// statistics (`saved`), then n - 1 moves of the blocks with their gradients
/// and one last move of the gradients home. Around them, the causal balancing
/// moves: each tensor in (q, k, v; and g, and the saved result and statistics)
/// and out (o and the forward's statistics `stats`; dq, dk, dv) travels as
/// two halves when the block splits in two.
std::pair<double, double> ringTransfersOf(RankedTensorType query, RankedTensorType key,
                                          int64_t ranks, bool grad, bool stats) {
  if (ranks <= 1)
    return {0.0, 0.0};
  const double n = static_cast<double>(ranks);
  const double q = 4.0 * static_cast<double>(query.getNumElements()),
               k = 4.0 * static_cast<double>(key.getNumElements()), kv = 2 * k;
  const double rows = q / static_cast<double>(query.getDimSize(3)); // f32 per query row
  const bool halves = query.getDimSize(2) % 2 == 0;
  const bool forwardRing = !grad || !stats;
  double bytes = forwardRing ? (n - 1) * kv : 0, messages = forwardRing ? n - 1 : 0;
  if (grad) {
    bytes += (n - 1) * 2 * kv + kv;
    messages += 2 * (n - 1) + 1;
  }
  if (halves) {
    // Tensors moved whole: q, k, v, o (forward); q, k, v, g, dq, dk, dv (gradient).
    bytes += grad ? 2 * q + 2 * k + q + 2 * k : 2 * q + 2 * k;
    messages += grad ? 2 * 7 : 2 * 4;
    if (stats) { // the statistics out; the gradient's saved result and statistics in
      bytes += grad ? q + rows : rows;
      messages += grad ? 2 * 2 : 2;
    }
  }
  return {bytes, messages};
}
} // namespace

std::pair<double, double> RingAttentionOp::ringTransfers(int64_t ranks) {
  return ringTransfersOf(getQuery().getType(), getKey().getType(), ranks, /*grad=*/false,
                         static_cast<bool>(getStats()));
}
std::pair<double, double> RingAttentionGradOp::ringTransfers(int64_t ranks, bool saved) {
  return ringTransfersOf(getQuery().getType(), getKey().getType(), ranks, /*grad=*/true, saved);
}

namespace {
/// Ring attention and its gradient: one mesh axis, [batch, heads, seq,
/// head_dim] queries and keys.
LogicalResult verifyRingAttention(Operation *op, ArrayAttr axes, RankedTensorType query,
                                  RankedTensorType key, Value positions) {
  if (failed(resolveAxes(op, axes, /*single=*/true)))
    return failure();
  if (query.getRank() != 4 || key.getRank() != 4)
    return op->emitOpError() << "operands must be [batch, heads, seq, head_dim]";
  if (positions) // the device's block of packed documents' positions
    return verifyTokenPositions(op, query, cast<RankedTensorType>(positions.getType()));
  return success();
}
} // namespace

LogicalResult RingAttentionOp::verify() {
  RankedTensorType q = getQuery().getType();
  if (failed(verifyRingAttention(*this, getAxes(), q, getKey().getType(), getPositions())))
    return failure();
  return verifyAttentionStats(*this, getStats(), Value(), q, q.getDimSize(0), q.getDimSize(1),
                              q.getDimSize(2));
}

LogicalResult RingAttentionGradOp::verify() {
  RankedTensorType q = getQuery().getType();
  if (failed(verifyRingAttention(*this, getAxes(), q, getKey().getType(), getPositions())))
    return failure();
  return verifyAttentionStats(*this, getSavedStats(), getSavedResult(), q, q.getDimSize(0),
                              q.getDimSize(1), q.getDimSize(2));
}
