// serving_build.cpp — see serving_build.h (the flash rules are listed there).
#include "app/core/serving_build.h"

#include <algorithm>

#include "engine/printable.h"

namespace kvscope::app {

ServingBuilder::ServingBuilder(const Scheduler& sched, const ServingConfig& cfg, uint64_t run,
                               std::vector<ServingRequest> requests)
    : sched_(sched), cfg_(cfg), run_(run) {
  hash_hits_.assign(size_t(sched_.pool().n_blocks()), 0);
  for (ServingRequest& q : requests) add_request(std::move(q));
}

void ServingBuilder::add_request(ServingRequest q) {
  const Tokenizer& tok = sched_.model().tokenizer();
  const int index = int(requests_.size());
  std::vector<std::string> pieces;
  pieces.reserve(q.prompt.size());
  for (int32_t id : q.prompt) pieces.push_back(printable_label(tok.token_bytes(id)));
  for (int k = 0; k < q.n; ++k) {
    const int seq = q.first_seq + k;
    if (int(lanes_.size()) <= seq) lanes_.resize(size_t(seq) + 1);
    Lane& l = lanes_[size_t(seq)].lane;
    l.seq = seq;
    l.request = index;
    l.sample = k;
    l.color = index;
    l.prompt_tokens = int(q.prompt.size());
    l.ids = q.prompt;
    l.pieces = pieces;
    l.arrival_step = q.arrival_step;
  }
  requests_.push_back(std::move(q));
}

std::vector<const std::vector<int32_t>*> ServingBuilder::LaneRec::tables() const {
  if (groups.empty()) return {&lane.table};
  std::vector<const std::vector<int32_t>*> out;
  for (const auto& t : groups) out.push_back(&t);
  return out;
}

void ServingBuilder::header(ServingSnapshot& s) const {
  const SchedulerConfig& c = sched_.config();
  s.run = run_;
  s.block_size = c.block_size;
  s.n_blocks = sched_.pool().n_blocks();
  s.max_batch_tokens = c.max_batch_tokens;
  s.max_seqs = c.max_seqs;
  s.context = c.context;
  s.prefix_caching = c.prefix_caching;
  s.n_requests = int(requests_.size());
}

std::shared_ptr<ServingSnapshot> ServingBuilder::initial() const {
  auto s = std::make_shared<ServingSnapshot>();
  header(*s);
  s->tiles.resize(size_t(s->n_blocks));
  s->totals = sched_.stats();
  return s;
}

void ServingBuilder::apply_events(const BatchStep& st, Clock::time_point t0,
                                  std::vector<char>& cow_seq,
                                  std::vector<std::pair<int, int>>& hits) {
  for (const SchedEvent& e : st.events) {
    if (e.seq < 0 || e.seq >= int(lanes_.size())) continue;
    LaneRec& r = lanes_[size_t(e.seq)];
    switch (e.kind) {
      case EventKind::Arrive:
        r.known = true;
        r.arrived = t0;
        break;
      case EventKind::Fork:
        if (!r.known && r.lane.ids.empty() && e.n >= 0 && e.n < int(lanes_.size()) &&
            e.n != e.seq) {
          // A beam: a sequence the request did not name, forked at this step off its
          // parent's tokens so far (the parent's row for this step comes after the events).
          const Lane& p = lanes_[size_t(e.n)].lane;
          Lane& l = r.lane;
          l.seq = e.seq;
          l.request = p.request;
          l.color = p.color;
          l.prompt_tokens = p.prompt_tokens;
          l.cached_tokens = p.cached_tokens;
          l.ids = p.ids;
          l.pieces = p.pieces;
          l.arrival_step = p.arrival_step;
          r.first_token = lanes_[size_t(e.n)].first_token;
          r.first_at = lanes_[size_t(e.n)].first_at;
          r.generated = lanes_[size_t(e.n)].generated;
          l.ttft_ms = p.ttft_ms;
        }
        r.known = true;
        r.lane.parent = e.n;
        if (e.n >= 0 && e.n < int(lanes_.size())) r.arrived = lanes_[size_t(e.n)].arrived;
        break;
      case EventKind::PrefixHit:
        r.lane.cached_tokens = e.n;
        hits.push_back({e.seq, e.n});
        break;
      case EventKind::Preempt:
        // Its blocks went back before the forward; it holds nothing until admitted again.
        r.preempted = true;
        ++r.lane.preemptions;
        r.lane.table.clear();
        r.groups.clear();
        r.lane.computed = 0;
        break;
      case EventKind::Cow:
        cow_seq[size_t(e.seq)] = 1;
        break;
      case EventKind::Fail:
        r.lane.stop = e.detail;
        break;
      default:
        break;
    }
  }
}

void ServingBuilder::apply_row(const StepRow& row, bool cow_event, Clock::time_point t1,
                               std::vector<char>& written, std::vector<char>& cow) {
  const int B = sched_.config().block_size;
  LaneRec& r = lanes_[size_t(row.seq)];
  Lane& l = r.lane;
  r.known = true;
  r.preempted = false;
  if (cow_event) {  // the block that changed id at a logical index is the private copy
    const auto before = r.tables();
    std::vector<const std::vector<int32_t>*> after{&row.table};
    if (!row.tables.empty()) {
      after.clear();
      for (const auto& t : row.tables) after.push_back(&t);
    }
    for (size_t g = 0; g < std::min(before.size(), after.size()); ++g) {
      const auto &was = *before[g], &now = *after[g];
      for (size_t i = 0; i < std::min(was.size(), now.size()); ++i)
        if (now[i] >= 0 && now[i] != was[i]) cow[size_t(now[i])] = 1;
    }
  }
  l.table = row.table;
  r.groups = row.tables;
  l.computed = row.pos0 + row.tokens - row.rolled_back();  // what the cache holds
  l.step_tokens = row.tokens;
  l.step_prompt = row.is_prompt;
  l.drafted.clear();  // speculation: what was drafted this step, and how much was kept
  for (int32_t t : row.drafted)
    l.drafted.push_back(printable_label(sched_.model().tokenizer().token_bytes(t)));
  l.accepted = row.drafted.empty() ? 0 : row.accepted;
  for (const auto* t : r.tables())
    for (int p = row.pos0; p < row.pos0 + row.tokens; ++p) {
      const size_t i = size_t(p / B);
      if (i < t->size() && (*t)[i] >= 0) written[size_t((*t)[i])] = 1;
    }
  for (int32_t t : row.tokens_out) {  // several with a verified draft
    l.ids.push_back(t);
    l.pieces.push_back(printable_label(sched_.model().tokenizer().token_bytes(t)));
    ++r.generated;
    if (!r.first_token) {
      r.first_token = true;
      r.first_at = t1;
      l.ttft_ms = std::chrono::duration<double, std::milli>(t1 - r.arrived).count();
    }
    const double s = std::chrono::duration<double>(t1 - r.first_at).count();
    l.tokens_per_s = r.generated > 1 && s > 0 ? double(r.generated - 1) / s : 0.0;
  }
  // [L][H][P] for the newest query: the middle layer, mean over heads.
  const auto& mc = sched_.model().config();
  const int L = mc.n_layer, H = mc.n_head, P = row.pos0 + row.tokens;
  if (L > 0 && H > 0 && P > 0 && row.attention.size() == size_t(L) * size_t(H) * size_t(P)) {
    l.attention.assign(size_t(P), 0.0f);
    const float* a = row.attention.data() + size_t(L / 2) * size_t(H) * size_t(P);
    for (int h = 0; h < H; ++h)
      for (int p = 0; p < P; ++p) l.attention[size_t(p)] += a[size_t(h) * size_t(P) + size_t(p)];
    for (float& x : l.attention) x /= float(H);
  }
}

void ServingBuilder::build_tiles(ServingSnapshot& s, const std::vector<char>& written,
                                 const std::vector<char>& adopted, const std::vector<char>& cow) {
  const KvPool& pool = sched_.pool();
  const int N = pool.n_blocks(), B = pool.block_size();
  s.tiles.assign(size_t(N), PoolTile{});
  for (int b = 0; b < N; ++b) {
    PoolTile& t = s.tiles[size_t(b)];
    t.refs = pool.ref_count(b);
    t.state = t.refs > 0 ? TileState::Used : pool.cached(b) ? TileState::Cached : TileState::Free;
    t.published = pool.published(b);
    t.hash_hits = hash_hits_[size_t(b)];
    if (t.state == TileState::Cached) t.n_pos = B;  // published blocks are full
  }
  for (const LaneRec& r : lanes_) {  // by id: owners come out lowest id first
    if (!r.known) continue;
    const Lane& l = r.lane;
    for (const auto* table : r.tables())
      for (size_t i = 0; i < table->size(); ++i) {
        const int b = (*table)[i];
        if (b < 0 || b >= N) continue;
        PoolTile& t = s.tiles[size_t(b)];
        t.owners.push_back(l.seq);
        if (t.logical < 0) {
          t.logical = int(i);
          t.first_pos = int(i) * B;
          t.n_pos = std::clamp(l.computed - int(i) * B, 0, B);
        }
      }
  }
  for (int b = 0; b < N; ++b) {
    PoolTile& t = s.tiles[size_t(b)];
    const int prev_refs = prev_.empty() ? 0 : prev_[size_t(b)].refs;
    const bool was_cached = !prev_.empty() && prev_[size_t(b)].state == TileState::Cached;
    if (t.state != TileState::Used)
      t.flash = prev_refs > 0 || written[size_t(b)] ? TileFlash::Released : TileFlash::None;
    else if (cow[size_t(b)])
      t.flash = TileFlash::Cow;
    else if (was_cached && !adopted[size_t(b)])
      t.flash = TileFlash::Evicted;
    else if (written[size_t(b)])
      t.flash = TileFlash::Written;
    else if (adopted[size_t(b)])
      t.flash = TileFlash::PrefixHit;
  }
}

ServingPoint ServingBuilder::point(const BatchStep& st) const {
  const SchedulerStats& t = sched_.stats();
  const int B = sched_.config().block_size;
  ServingPoint p;
  p.step = st.step;
  p.running = st.running;
  p.waiting = st.waiting;
  p.finished = t.finished;
  p.used = st.pool.counts.used;
  p.free = st.pool.counts.free;
  p.cached = st.pool.counts.cached;
  const double alloc = st.pool.allocated_slots;
  if (alloc > 0) p.slot_utilization = st.pool.held_positions / alloc;
  const double contiguous = double(st.running) * double(sched_.config().context);
  if (contiguous > 0) p.contiguous_utilization = st.pool.held_positions / contiguous;
  int empty = 0;  // slots past each running sequence's last position in its last block
  for (const LaneRec& r : lanes_)
    if (r.known && !r.lane.table.empty())
      empty += std::max(0, int(r.lane.table.size()) * B - r.lane.computed);
  if (alloc > 0) p.fragmentation = std::min(1.0, empty / alloc);
  const double hit = double(t.prefix_hit_tokens), pre = double(t.prefill_tokens);
  if (hit + pre > 0) p.prefix_hit_rate = hit / (hit + pre);
  for (const StepRow& r : st.rows) {
    (r.is_prompt ? p.prefill_tokens : p.decode_tokens) += r.tokens;
    p.drafted += int(r.drafted.size());
    p.accepted += r.drafted.empty() ? 0 : r.accepted;
  }
  p.ms = st.ms;
  if (st.ms > 0) p.tokens_per_s = st.batch_tokens * 1000.0 / st.ms;
  return p;
}

// States after a step (or a change between steps): a sequence not running holds no blocks.
void ServingBuilder::update_states() {
  for (LaneRec& r : lanes_) {
    if (!r.known) continue;
    Lane& l = r.lane;
    const SeqState s = sched_.state(l.seq);
    switch (s) {
      case SeqState::Running:
        l.state = LaneState::Running;
        break;
      case SeqState::Pending:
      case SeqState::Waiting:
        l.state = r.preempted ? LaneState::Preempted : LaneState::Waiting;
        break;
      case SeqState::Finished:
        l.state = LaneState::Finished;
        break;
      case SeqState::Cancelled:
        l.state = r.finished_outside ? LaneState::Finished : LaneState::Cancelled;
        break;
      case SeqState::Failed:
        l.state = LaneState::Failed;
        break;
    }
    if (s != SeqState::Running) {
      l.table.clear();
      r.groups.clear();
      l.computed = 0;
    }
    const bool ended = s == SeqState::Finished || s == SeqState::Cancelled || s == SeqState::Failed;
    if (ended && l.stop.empty()) l.stop = stop_reason_name(sched_.stop_reason(l.seq));
    if (ended && !r.ended) {
      r.ended = true;
      ended_.push_back(l.seq);
    }
  }
  // Long ago ended: out of the snapshots, their tokens freed.
  while (ended_.size() > kServingKeptEnded) {
    LaneRec& old = lanes_[size_t(ended_.front())];
    ended_.pop_front();
    old.retired = true;
    old.known = false;
    Lane gone;
    gone.seq = old.lane.seq;
    gone.state = old.lane.state;
    old.lane = std::move(gone);
    old.groups.clear();
  }
}

std::shared_ptr<ServingSnapshot> ServingBuilder::after_step(const BatchStep& st,
                                                            Clock::time_point t0,
                                                            Clock::time_point t1) {
  const int N = sched_.pool().n_blocks(), B = sched_.config().block_size;
  for (LaneRec& r : lanes_) {
    r.lane.step_tokens = 0;
    r.lane.step_prompt = false;
    r.lane.attention.clear();
    r.lane.drafted.clear();
    r.lane.accepted = 0;
  }
  std::vector<char> cow_seq(lanes_.size(), 0), written(size_t(N), 0), adopted(size_t(N), 0),
      cow(size_t(N), 0);
  std::vector<std::pair<int, int>> hits;
  // Beams fork sequences no request named: lanes for the new ids.
  for (const SchedEvent& e : st.events)
    if (e.kind == EventKind::Fork && e.seq >= int(lanes_.size())) lanes_.resize(size_t(e.seq) + 1);
  cow_seq.resize(lanes_.size(), 0);
  apply_events(st, t0, cow_seq, hits);
  for (const StepRow& row : st.rows)
    if (row.seq >= 0 && row.seq < int(lanes_.size()))
      apply_row(row, cow_seq[size_t(row.seq)], t1, written, cow);
  for (const auto& [seq, n] : hits)  // the admitted tables' first hit / B blocks
    for (const auto* table : lanes_[size_t(seq)].tables())
      for (size_t i = 0; i < size_t(n / B) && i < table->size(); ++i) {
        const int b = (*table)[i];
        if (b < 0 || b >= N) continue;
        ++hash_hits_[size_t(b)];
        adopted[size_t(b)] = 1;
      }
  update_states();

  auto snap = std::make_shared<ServingSnapshot>();
  header(*snap);
  snap->step = st.step;
  snap->done = sched_.idle();
  build_tiles(*snap, written, adopted, cow);
  for (LaneRec& r : lanes_) {
    if (!r.known) continue;
    snap->lanes.push_back(r.lane);  // attention: non-empty only for lanes that ran
    r.lane.attention.clear();
  }
  snap->waiting = sched_.waiting_ids();
  snap->events = st.events;
  history_.push_back(point(st));
  if (history_.size() > kServingKeptSteps)
    history_.erase(history_.begin(), history_.begin() + long(history_.size() - kServingKeptSteps));
  snap->history = history_;
  snap->totals = sched_.stats();
  prev_ = snap->tiles;
  return snap;
}

std::shared_ptr<ServingSnapshot> ServingBuilder::after_change(std::vector<SchedEvent> events) {
  const int N = sched_.pool().n_blocks();
  for (LaneRec& r : lanes_) {  // nothing ran
    r.lane.step_tokens = 0;
    r.lane.step_prompt = false;
    r.lane.attention.clear();
  }
  for (const SchedEvent& e : events)
    if (e.kind == EventKind::Finish && e.seq >= 0 && e.seq < int(lanes_.size())) {
      LaneRec& r = lanes_[size_t(e.seq)];
      r.finished_outside = true;
      r.lane.stop = e.detail;
    }
  update_states();
  auto snap = std::make_shared<ServingSnapshot>();
  header(*snap);
  snap->step = history_.empty() ? 0 : history_.back().step;
  snap->done = sched_.idle();
  const std::vector<char> none(size_t(N), 0);
  build_tiles(*snap, none, none, none);
  int running = 0;
  for (const LaneRec& r : lanes_) {
    if (!r.known) continue;
    snap->lanes.push_back(r.lane);
    running += r.lane.state == LaneState::Running;
  }
  snap->waiting = sched_.waiting_ids();
  snap->events = std::move(events);
  if (!history_.empty()) {
    ServingPoint& p = history_.back();
    const KvPoolCounts c = sched_.pool().counts();
    p.used = c.used;
    p.free = c.free;
    p.cached = c.cached;
    p.running = running;
    p.waiting = int(snap->waiting.size());
    p.finished = sched_.stats().finished;
  }
  snap->history = history_;
  snap->totals = sched_.stats();
  prev_ = snap->tiles;
  return snap;
}

}  // namespace kvscope::app
