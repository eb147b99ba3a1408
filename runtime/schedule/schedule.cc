// Pipeline schedules: generators, verification, simulation, SVG.

#include "runtime/schedule/schedule.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

namespace ptc::schedule {

std::string describe(const Action &a) {
  static const char *names[] = {"F", "B", "W", "SEND", "RECV"};
  std::ostringstream os;
  os << names[static_cast<int>(a.kind)];
  if (a.isCompute())
    os << " c" << a.chunk;
  else
    os << " ch" << a.channel;
  if (a.mb >= 0)
    os << " mb" << a.mb;
  else
    os << " (per step)";
  return os.str();
}

StatusOr<Action> parseAction(const std::string &text) {
  std::istringstream is(text);
  std::string kind, target, mb;
  is >> kind >> target;
  std::getline(is, mb);
  static const char *names[] = {"F", "B", "W", "SEND", "RECV"};
  Action a;
  int k = 0;
  while (k < 5 && kind != names[k])
    ++k;
  bool compute = k < 3;
  auto number = [](const std::string &s, size_t skip, int &out) {
    if (s.size() <= skip)
      return false;
    char *end = nullptr;
    long v = std::strtol(s.c_str() + skip, &end, 10);
    out = static_cast<int>(v);
    return *end == '\0' && v >= 0;
  };
  bool ok = k < 5 && number(target, compute ? 1 : 2, compute ? a.chunk : a.channel) &&
            target.compare(0, compute ? 1 : 2, compute ? "c" : "ch") == 0;
  if (ok) {
    a.kind = static_cast<ActionKind>(k);
    if (mb == " (per step)")
      a.mb = -1;
    else
      ok = mb.compare(0, 3, " mb") == 0 && number(mb, 3, a.mb);
  }
  if (!ok)
    return invalidArgument("malformed schedule action '", text, "'");
  return a;
}

const std::vector<std::string> &scheduleNames() {
  static const std::vector<std::string> names = optionSpellings<ScheduleKind>();
  return names;
}

StatusOr<ScheduleKind> parseSchedule(const std::string &name) {
  if (std::optional<ScheduleKind> kind = parseOption<ScheduleKind>(name))
    return *kind;
  std::string known;
  for (const std::string &n : scheduleNames())
    known += (known.empty() ? "" : ", ") + n;
  return invalidArgument("unknown schedule '", name, "' (expected one of: ", known, ")");
}

Status checkScheduleName(const std::string &name) {
  StatusOr<ScheduleKind> kind = parseSchedule(name);
  return kind.isOk() ? Status::ok() : kind.status();
}

Status generate(const std::string &name, Pipeline &p) {
  StatusOr<ScheduleKind> kind = parseSchedule(name);
  if (!kind.isOk())
    return kind.status();
  return generate(*kind, p);
}

namespace {
Action compute(Segment s, int chunk, int mb) {
  return Action{static_cast<ActionKind>(s), chunk, mb, -1};
}

/// ZB-H1 by list scheduling with unit-time F, B and W: a rank runs a ready B
/// first, else a ready F while fewer than (ranks - rank) micro-batches await
/// their B (1F1B's bound on forward activations), else a deferred W: weight
/// gradients fill what would be bubbles.
std::vector<std::vector<Action>> zeroBubbleH1(int p, int m) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> doneF(p, std::vector<double>(m, inf)), doneB = doneF;
  std::vector<int> nextF(p, 0), nextB(p, 0), nextW(p, 0);
  std::vector<double> freeAt(p, 0);
  std::vector<std::vector<Action>> order(p);
  int remaining = 3 * p * m;
  for (int t = 0; remaining > 0; ++t) {
    for (int r = 0; r < p; ++r) {
      if (freeAt[r] > t)
        continue;
      int b = nextB[r], f = nextF[r];
      bool bReady = b < m && doneF[r][b] <= t && (r == p - 1 || doneB[r + 1][b] <= t);
      bool fReady = f < m && f - nextB[r] < p - r && (r == 0 || doneF[r - 1][f] <= t);
      bool wReady = nextW[r] < nextB[r];
      if (bReady) {
        order[r].push_back(compute(Segment::Backward, r, b));
        doneB[r][b] = t + 1;
        ++nextB[r];
      } else if (fReady) {
        order[r].push_back(compute(Segment::Forward, r, f));
        doneF[r][f] = t + 1;
        ++nextF[r];
      } else if (wReady) {
        order[r].push_back(compute(Segment::Weight, r, nextW[r]));
        ++nextW[r];
      } else {
        continue;
      }
      freeAt[r] = t + 1;
      --remaining;
    }
  }
  return order;
}
} // namespace

Status generate(ScheduleKind kind, Pipeline &p) {
  const std::string name(optionName(kind));
  const int ranks = p.ranks, m = p.microbatches;
  if (ranks < 1 || p.chunks < ranks || p.chunks % ranks != 0)
    return invalidArgument("pipeline of ", ranks, " ranks cannot hold ", p.chunks, " chunks");
  if (m < 1)
    return invalidArgument("micro-batch count must be >= 1, got ", m);
  const int v = p.virtualStages();
  std::vector<std::vector<Action>> order(static_cast<size_t>(ranks));
  auto backward = [&](std::vector<Action> &list, int chunk, int mb) {
    list.push_back(compute(Segment::Backward, chunk, mb));
    if (p.splitWeight)
      list.push_back(compute(Segment::Weight, chunk, mb));
  };
  if (kind == ScheduleKind::GPipe || kind == ScheduleKind::OneFOneB) {
    if (v != 1)
      return invalidArgument("schedule '", name, "' runs one chunk per rank; use "
                             "interleaved-1f1b for ", v, " virtual stages");
    for (int r = 0; r < ranks; ++r) {
      auto &list = order[static_cast<size_t>(r)];
      int warm = kind == ScheduleKind::GPipe ? m : std::min(ranks - 1 - r, m);
      for (int i = 0; i < warm; ++i)
        list.push_back(compute(Segment::Forward, r, i));
      for (int i = 0; i < m - warm; ++i) {
        list.push_back(compute(Segment::Forward, r, warm + i));
        backward(list, r, i);
      }
      for (int i = m - warm; i < m; ++i)
        backward(list, r, i);
    }
  } else if (kind == ScheduleKind::Interleaved1F1B) {
    if (ranks > 1 && m % ranks != 0)
      return invalidArgument("interleaved-1f1b needs the micro-batch count (", m,
                             ") to be a multiple of the pipeline ranks (", ranks, ")");
    const int total = m * v;
    auto mbOf = [&](int k) { return (k / (ranks * v)) * ranks + k % ranks; };
    for (int r = 0; r < ranks; ++r) {
      auto &list = order[static_cast<size_t>(r)];
      auto fwd = [&](int k) {
        list.push_back(compute(Segment::Forward, ((k / ranks) % v) * ranks + r, mbOf(k)));
      };
      auto bwd = [&](int k) { backward(list, (v - 1 - (k / ranks) % v) * ranks + r, mbOf(k)); };
      int warm = m == ranks ? total : std::min((ranks - r - 1) * 2 + (v - 1) * ranks, total);
      for (int k = 0; k < warm; ++k)
        fwd(k);
      for (int k = 0; k < total - warm; ++k) {
        fwd(warm + k);
        bwd(k);
      }
      for (int k = total - warm; k < total; ++k)
        bwd(k);
    }
  } else {
    if (v != 1)
      return invalidArgument("zb-h1 runs one chunk per rank, not ", v);
    if (!p.splitWeight)
      return invalidArgument("zb-h1 needs the backward pass split into input and weight "
                             "gradients (ptc-split-stages split-weight=true)");
    order = zeroBubbleH1(ranks, m);
  }

  // Transfers: per-step ones first, then each micro-batch's receives right
  // before the action that needs them and sends right after the producer.
  p.actions.assign(static_cast<size_t>(ranks), {});
  for (int r = 0; r < ranks; ++r) {
    auto &out = p.actions[static_cast<size_t>(r)];
    for (int pass = 0; pass < 2; ++pass)
      for (size_t c = 0; c < p.channels.size(); ++c) {
        const Channel &ch = p.channels[c];
        int rank = pass == 0 ? p.rankOf(ch.from) : p.rankOf(ch.to);
        if (ch.perStep && !ch.atEnd && rank == r)
          out.push_back({pass == 0 ? ActionKind::Send : ActionKind::Recv, -1, -1,
                         static_cast<int>(c)});
      }
    for (const Action &a : order[static_cast<size_t>(r)]) {
      for (size_t c = 0; c < p.channels.size(); ++c) {
        const Channel &ch = p.channels[c];
        if (!ch.perStep && ch.to == a.chunk && ch.toSegment == a.segment())
          out.push_back({ActionKind::Recv, -1, a.mb, static_cast<int>(c)});
      }
      out.push_back(a);
      for (size_t c = 0; c < p.channels.size(); ++c) {
        const Channel &ch = p.channels[c];
        if (!ch.perStep && ch.from == a.chunk && ch.fromSegment == a.segment())
          out.push_back({ActionKind::Send, -1, a.mb, static_cast<int>(c)});
      }
    }
    for (int pass = 0; pass < 2; ++pass)
      for (size_t c = 0; c < p.channels.size(); ++c) {
        const Channel &ch = p.channels[c];
        int rank = pass == 0 ? p.rankOf(ch.from) : p.rankOf(ch.to);
        if (ch.perStep && ch.atEnd && rank == r)
          out.push_back({pass == 0 ? ActionKind::Send : ActionKind::Recv, -1, -1,
                         static_cast<int>(c)});
      }
  }
  return Status::ok();
}

namespace {
/// Runs the lists with receives blocking until their send has run; returns
/// the boxes, or the blocked ranks when no rank can move.
StatusOr<Report> run(const Pipeline &p, const Timing &timing) {
  const int v = p.virtualStages();
  for (const std::vector<double> *d : {&timing.forward, &timing.backward, &timing.weight})
    if (!d->empty() && d->size() != static_cast<size_t>(p.chunks))
      return invalidArgument("timing has ", d->size(), " durations for a ", p.chunks, "-chunk pipeline");
  auto cost = [&](const Action &a) {
    const std::vector<double> &given = a.kind == ActionKind::Forward    ? timing.forward
                                       : a.kind == ActionKind::Backward ? timing.backward
                                                                        : timing.weight;
    if (!given.empty())
      return given[static_cast<size_t>(a.chunk)];
    double c = a.kind == ActionKind::Forward ? 1.0 : a.kind == ActionKind::Backward ? (p.splitWeight ? 1.0 : 2.0) : 1.0;
    return c / v;
  };
  Report rep;
  size_t ranks = static_cast<size_t>(p.ranks);
  std::vector<size_t> next(ranks, 0);
  std::vector<double> now(ranks, 0.0);
  rep.busy.assign(ranks, 0.0);
  rep.sendBytes.assign(ranks, 0);
  std::map<std::pair<int, int>, double> sent; // (channel, mb) -> time
  bool progress = true, done = false;
  while (progress && !done) {
    progress = false;
    done = true;
    for (size_t r = 0; r < ranks; ++r) {
      const auto &list = p.actions[r];
      while (next[r] < list.size()) {
        const Action &a = list[next[r]];
        if (a.kind == ActionKind::Recv) {
          auto it = sent.find({a.channel, a.mb});
          if (it == sent.end())
            break;
          now[r] = std::max(now[r], it->second + (a.mb >= 0 ? timing.transfer : 0.0));
        } else if (a.kind == ActionKind::Send) {
          sent[{a.channel, a.mb}] = now[r];
          rep.sendBytes[r] += p.channels[static_cast<size_t>(a.channel)].bytes;
        } else {
          double c = cost(a);
          rep.boxes.push_back({static_cast<int>(r), a, now[r], now[r] + c});
          now[r] += c;
          rep.busy[r] += c;
        }
        ++next[r];
        progress = true;
      }
      done &= next[r] == list.size();
    }
  }
  if (!done) {
    std::ostringstream os;
    os << "deadlock: no rank can proceed;";
    for (size_t r = 0; r < ranks; ++r)
      if (next[r] < p.actions[r].size())
        os << " rank " << r << " waits at action #" << next[r] << " ("
           << describe(p.actions[r][next[r]]) << ");";
    std::string msg = os.str();
    msg.pop_back();
    return invalidArgument(msg);
  }
  for (double t : now)
    rep.makespan = std::max(rep.makespan, t);
  double idle = 0;
  for (double b : rep.busy)
    idle += rep.makespan > 0 ? (rep.makespan - b) / rep.makespan : 0;
  rep.bubble = idle / static_cast<double>(ranks);
  rep.peakInFlight.assign(ranks, 0);
  rep.peakAwaitingWeight.assign(ranks, 0);
  std::vector<int> held(ranks, 0), awaiting(ranks, 0);
  for (const Box &b : rep.boxes) {
    size_t r = static_cast<size_t>(b.rank);
    if (b.action.kind == ActionKind::Forward) {
      rep.peakInFlight[r] = std::max(rep.peakInFlight[r], ++held[r]);
    } else if (b.action.kind == ActionKind::Backward) {
      --held[r];
      if (p.splitWeight)
        rep.peakAwaitingWeight[r] = std::max(rep.peakAwaitingWeight[r], ++awaiting[r]);
    } else {
      --awaiting[r];
    }
  }
  return rep;
}
} // namespace

Status verify(const Pipeline &p) {
  if (p.ranks < 1 || p.chunks < p.ranks || p.chunks % p.ranks != 0)
    return invalidArgument("pipeline of ", p.ranks, " ranks cannot hold ", p.chunks, " chunks");
  if (p.microbatches < 1)
    return invalidArgument("micro-batch count must be >= 1, got ", p.microbatches);
  if (p.actions.size() != static_cast<size_t>(p.ranks))
    return invalidArgument("schedule has action lists for ", p.actions.size(), " ranks, the pipeline has ",
                           p.ranks);
  for (size_t c = 0; c < p.channels.size(); ++c) {
    const Channel &ch = p.channels[c];
    if (ch.from < 0 || ch.from >= p.chunks || ch.to < 0 || ch.to >= p.chunks || ch.from == ch.to)
      return invalidArgument("channel ", c, " connects chunks ", ch.from, " -> ", ch.to,
                             " of a ", p.chunks, "-chunk pipeline");
    if (!p.splitWeight && (ch.fromSegment == Segment::Weight || ch.toSegment == Segment::Weight))
      return invalidArgument("channel ", c, " uses a weight-gradient segment, but the pipeline has none");
  }
  const int segments = p.splitWeight ? 3 : 2;
  // Positions of every compute action and transfer, per rank.
  std::map<std::tuple<int, int, int>, size_t> at;      // (chunk, segment, mb) -> position
  std::map<std::tuple<int, int, int>, size_t> xfer;    // (kind, channel, mb) -> position
  for (int r = 0; r < p.ranks; ++r) {
    const auto &list = p.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action &a = list[i];
      std::string where = "rank " + std::to_string(r) + " action #" + std::to_string(i) + " (" +
                          describe(a) + ")";
      if (a.isCompute()) {
        if (a.chunk < 0 || a.chunk >= p.chunks || p.rankOf(a.chunk) != r)
          return invalidArgument(where, ": chunk ", a.chunk, " does not live on rank ", r);
        if (static_cast<int>(a.kind) >= segments)
          return invalidArgument(where, ": the pipeline has no weight-gradient segments");
        if (a.mb < 0 || a.mb >= p.microbatches)
          return invalidArgument(where, ": micro-batch out of range [0, ", p.microbatches, ")");
        if (!at.emplace(std::make_tuple(a.chunk, static_cast<int>(a.kind), a.mb), i).second)
          return invalidArgument(where, ": computed twice");
        continue;
      }
      if (a.channel < 0 || static_cast<size_t>(a.channel) >= p.channels.size())
        return invalidArgument(where, ": no such channel (the plan has ", p.channels.size(), ")");
      const Channel &ch = p.channels[static_cast<size_t>(a.channel)];
      int owner = p.rankOf(a.kind == ActionKind::Send ? ch.from : ch.to);
      if (owner != r)
        return invalidArgument(where, ": channel ", a.channel, " (chunk ", ch.from, " -> ", ch.to,
                               ") is ", a.kind == ActionKind::Send ? "sent" : "received",
                               " by rank ", owner);
      if (ch.perStep ? a.mb != -1 : (a.mb < 0 || a.mb >= p.microbatches))
        return invalidArgument(where, ": channel ", a.channel,
                               ch.perStep ? " travels once per step" : " needs a micro-batch in range");
      if (!xfer.emplace(std::make_tuple(static_cast<int>(a.kind), a.channel, a.mb), i).second)
        return invalidArgument(where, ": appears twice");
    }
  }
  for (int c = 0; c < p.chunks; ++c)
    for (int s = 0; s < segments; ++s)
      for (int mb = 0; mb < p.microbatches; ++mb)
        if (!at.count({c, s, mb}))
          return invalidArgument("rank ", p.rankOf(c), " never runs ",
                                 describe(compute(static_cast<Segment>(s), c, mb)));
  for (size_t c = 0; c < p.channels.size(); ++c) {
    const Channel &ch = p.channels[c];
    int first = ch.perStep ? -1 : 0, last = ch.perStep ? -1 : p.microbatches - 1;
    for (int mb = first; mb <= last; ++mb) {
      Action recv{ActionKind::Recv, -1, mb, static_cast<int>(c)};
      bool hasSend = xfer.count({static_cast<int>(ActionKind::Send), static_cast<int>(c), mb}) != 0;
      bool hasRecv = xfer.count({static_cast<int>(ActionKind::Recv), static_cast<int>(c), mb}) != 0;
      if (hasRecv && !hasSend)
        return invalidArgument("rank ", p.rankOf(ch.to), " waits for ", describe(recv),
                               " (chunk ", ch.from, " -> ", ch.to, "), which rank ",
                               p.rankOf(ch.from), " never sends");
      if (!hasRecv)
        return invalidArgument("rank ", p.rankOf(ch.to), " never receives ", describe(recv),
                               " (chunk ", ch.from, " -> ", ch.to, ")");
    }
  }
  // Dependencies within a rank.
  auto pos = [&](int chunk, Segment s, int mb) { return at.at({chunk, static_cast<int>(s), mb}); };
  for (int c = 0; c < p.chunks; ++c)
    for (int mb = 0; mb < p.microbatches; ++mb)
      for (int s = 1; s < segments; ++s)
        if (pos(c, static_cast<Segment>(s), mb) < pos(c, static_cast<Segment>(s - 1), mb))
          return invalidArgument("rank ", p.rankOf(c), " runs ",
                                 describe(compute(static_cast<Segment>(s), c, mb)), " before ",
                                 describe(compute(static_cast<Segment>(s - 1), c, mb)));
  for (const auto &[key, i] : xfer) {
    auto [kind, c, mb] = key;
    const Channel &ch = p.channels[static_cast<size_t>(c)];
    Action a{static_cast<ActionKind>(kind), -1, mb, c};
    if (static_cast<ActionKind>(kind) == ActionKind::Send) {
      if (ch.atEnd)
        for (int m = 0; m < p.microbatches; ++m)
          for (int s = 0; s < segments; ++s)
            if (i < pos(ch.from, static_cast<Segment>(s), m))
              return invalidArgument("rank ", p.rankOf(ch.from), " runs ", describe(a),
                                     " at action #", i, " before ",
                                     describe(compute(static_cast<Segment>(s), ch.from, m)),
                                     " (it carries a sum over every micro-batch)");
      if (!ch.perStep && i < pos(ch.from, ch.fromSegment, mb))
        return invalidArgument("rank ", p.rankOf(ch.from), " runs ", describe(a), " at action #", i,
                               " before ", describe(compute(ch.fromSegment, ch.from, mb)),
                               " produces it");
      continue;
    }
    if (ch.atEnd)
      continue; // read by the once-per-step instructions, after every action
    size_t need = ch.perStep ? pos(ch.to, Segment::Forward, 0) : pos(ch.to, ch.toSegment, mb);
    if (ch.perStep)
      for (int m = 0; m < p.microbatches; ++m)
        for (int s = 0; s < segments; ++s)
          need = std::min(need, pos(ch.to, static_cast<Segment>(s), m));
    if (i > need)
      return invalidArgument("rank ", p.rankOf(ch.to), " runs ", describe(a), " at action #", i,
                             ", after action #", need, " (",
                             describe(p.actions[static_cast<size_t>(p.rankOf(ch.to))][need]),
                             ") that needs it");
  }
  StatusOr<Report> sim = run(p, Timing{});
  return sim.isOk() ? Status::ok() : sim.status();
}

StatusOr<Report> simulate(const Pipeline &p, const Timing &timing, bool verified) {
  if (!verified)
    PTC_RETURN_IF_ERROR(verify(p));
  return run(p, timing);
}

double closedFormBubble(ScheduleKind kind, int ranks, int virtualStages, int microbatches) {
  double p = ranks, m = microbatches, v = virtualStages;
  switch (kind) {
  case ScheduleKind::GPipe:
  case ScheduleKind::OneFOneB:
    return (p - 1) / (m + p - 1);
  case ScheduleKind::Interleaved1F1B:
    return (p - 1) / (v * m + p - 1);
  case ScheduleKind::ZbH1: // idle (p-1)(T_F + T_B - T_W) with T_F = T_B = T_W
    return (p - 1) / (3 * m + p - 1);
  }
  return -1;
}

std::string svg(const Pipeline &p, const Report &r, const std::string &title) {
  const double width = 960, left = 70, row = 30, top = 40;
  double scale = r.makespan > 0 ? (width - left - 10) / r.makespan : 1;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
     << top + row * p.ranks + 30 << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
     << "<text x=\"10\" y=\"20\" font-size=\"14\">" << title << "</text>\n";
  for (int k = 0; k < p.ranks; ++k)
    os << "<text x=\"10\" y=\"" << top + row * k + 19 << "\">rank " << k << "</text>\n";
  const char *colors[3][2] = {{"#4e79a7", "#a0cbe8"}, {"#59a14f", "#8cd17d"}, {"#f28e2b", "#ffbe7d"}};
  for (const Box &b : r.boxes) {
    int kind = static_cast<int>(b.action.kind);
    int shade = (b.action.chunk / p.ranks) % 2;
    double x = left + b.start * scale, w = (b.end - b.start) * scale;
    double y = top + row * b.rank;
    os << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << row - 4
       << "\" fill=\"" << colors[kind][shade] << "\" stroke=\"#333\" stroke-width=\"0.5\"><title>"
       << describe(b.action) << "</title></rect>\n";
    if (w >= 12)
      os << "<text x=\"" << x + w / 2 << "\" y=\"" << y + 17 << "\" text-anchor=\"middle\" fill=\"#fff\">"
         << b.action.mb << "</text>\n";
  }
  os << "<text x=\"10\" y=\"" << top + row * p.ranks + 20 << "\">forward (blue), backward (green)"
     << (p.splitWeight ? ", weight gradient (orange)" : "") << "; bubble "
     << static_cast<int>(std::lround(1000 * r.bubble)) / 10.0 << "%</text>\n</svg>\n";
  return os.str();
}

} // namespace ptc::schedule
