#include "cache/shadow_radix.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_set>

#include "base/log.h"

namespace v4::cache {

namespace {
/// Runs ShadowRadix::debug_check when a public call returns (debug builds).
template <typename R>
struct CheckOnExit {
  const R* r;
  const char* op;
  ~CheckOnExit() { r->debug_check_public(op); }
};
}  // namespace

/// One radix node: the edge's tokens [start, end) and the virtual pages holding them (page
/// indices start/P .. (end-1)/P; a page straddling the node's start may be shared with the
/// parent). The boundary at `end` is resumable iff `snapshot >= 0` (then `swa_vblocks` keeps the
/// window [end - W, end), as addressed by the tree's page table of this node's path).
struct RadixNode {
  int32_t id = 0;
  RadixNode* parent = nullptr;
  std::unordered_map<int32_t, std::unique_ptr<RadixNode>> children;  // key: first token
  std::vector<int32_t> tokens;
  int64_t start = 0;
  std::vector<int32_t> pages;
  int32_t snapshot = -1;
  std::vector<int64_t> swa_vblocks;
  bool tombstone = false;  // boundary state was freed by eviction (phase 1)
  int32_t lock = 0;        // running sequences whose locked path contains this node
  int32_t swa_lock = 0;    // running sequences that resumed at this node's boundary
  uint64_t last_access = 0;
  int64_t end() const { return start + int64_t(tokens.size()); }
  bool is_root() const { return parent == nullptr; }
  bool resumable() const { return is_root() || snapshot >= 0; }
};

/// A running sequence: its page table (references held on every page), the SWA position blocks
/// it holds for its window [lo, hi), and the boundaries it saved so far.
struct ShadowRadix::Seq {
  struct Boundary {
    int64_t pos = 0;
    int32_t snap = -1;
    std::vector<int64_t> vblocks;
  };
  int32_t id = -1;
  std::vector<int32_t> tokens;  // positions [start, len) (the prefix is the path to `node`)
  int64_t start = 0;            // first position computed by this sequence (R)
  int64_t len = 0;              // committed tokens
  int64_t reserved = 0;         // positions [0, reserved) have pages and SWA
  std::vector<int32_t> pt;      // page table
  int64_t own_from = 0;         // page indices >= own_from are this sequence's own pages
  RadixNode* node = nullptr;    // locked node (ends at `start`), root when cold
  int64_t win_lo = 0, win_hi = 0;  // held SWA position blocks
  std::vector<Boundary> bounds;
  int64_t vblock(const ShadowRadix& r, int64_t pb) const {
    const int64_t bpp = r.blocks_per_page();
    return int64_t(pt[size_t(pb / bpp)]) * bpp + pb % bpp;
  }
};

ShadowRadix::ShadowRadix(const ShadowRadixConfig& cfg)
    : cfg_(cfg),
      pages_(cfg.n_pages),
      swa_(int64_t(cfg.n_pages) * (cfg.page_tokens / cfg.swa_page_tokens), cfg.n_swa_pages,
           cfg.swa_page_tokens),
      snaps_(cfg.n_snapshots),
      root_(std::make_unique<RadixNode>()) {}

ShadowRadix::~ShadowRadix() = default;

Result<std::unique_ptr<ShadowRadix>> ShadowRadix::create(const ShadowRadixConfig& c) {
  if (c.page_tokens <= 0 || c.page_tokens % 128 != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "ShadowRadix: page size {} tokens must be a positive multiple of 128",
                      c.page_tokens);
  if (c.swa_page_tokens <= 0 || c.page_tokens % c.swa_page_tokens != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "ShadowRadix: SWA page size {} must divide the page size {}",
                      c.swa_page_tokens, c.page_tokens);
  if (c.window_tokens <= 0 || c.window_tokens > c.page_tokens)
    return make_error(ErrorCode::kInvalidArgument,
                      "ShadowRadix: window {} must be in [1, page size {}]", c.window_tokens,
                      c.page_tokens);
  if (c.n_pages < 0 || c.n_swa_pages < 0 || c.n_snapshots < 0)
    return make_error(ErrorCode::kInvalidArgument, "ShadowRadix: negative pool size");
  return std::unique_ptr<ShadowRadix>(new ShadowRadix(c));
}

ShadowRadix::Seq* ShadowRadix::find_seq(int32_t id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}
const ShadowRadix::Seq* ShadowRadix::find_seq(int32_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

// ---- tree helpers ---------------------------------------------------------------------------

std::vector<int32_t> ShadowRadix::path_page_table(const RadixNode* n, int64_t from_idx) const {
  // Walk up from n: the deepest node covering a page index names its page (first writer wins).
  std::vector<int32_t> pt(size_t(n_page_idx(n->end())), -1);
  const int64_t P = cfg_.page_tokens;
  for (const RadixNode* x = n; x && !x->is_root(); x = x->parent) {
    if (x->end() <= from_idx * P) break;  // this ancestor and all above end before from_idx
    const int64_t first = x->start / P;
    for (int64_t i = std::max<int64_t>(0, from_idx - first); i < int64_t(x->pages.size()); ++i)
      if (pt[size_t(first + i)] < 0) pt[size_t(first + i)] = x->pages[size_t(i)];
  }
  return pt;
}

std::vector<int32_t> ShadowRadix::window_page_table(const RadixNode* n) const {
  return path_page_table(n, std::max<int64_t>(0, n->end() - cfg_.window_tokens) / cfg_.page_tokens);
}

std::vector<int64_t> ShadowRadix::window_vblocks(const std::vector<int32_t>& pt,
                                                 int64_t end) const {
  std::vector<int64_t> out;
  if (end <= 0) return out;
  const int64_t Ps = cfg_.swa_page_tokens, bpp = blocks_per_page();
  const int64_t lo = std::max<int64_t>(0, end - cfg_.window_tokens) / Ps, hi = (end - 1) / Ps;
  for (int64_t pb = lo; pb <= hi; ++pb) {
    const int32_t page = pt[size_t(pb / bpp)];
    out.push_back(page < 0 ? -1 : int64_t(page) * bpp + pb % bpp);
  }
  return out;
}

bool ShadowRadix::window_written(const std::vector<int32_t>& pt, int64_t end) const {
  const int64_t Ps = cfg_.swa_page_tokens, bpp = blocks_per_page();
  for (int64_t p = std::max<int64_t>(0, end - cfg_.window_tokens); p < end; ++p) {
    const int32_t page = pt[size_t(p / Ps / bpp)];
    if (page < 0 || !swa_.written(int64_t(page) * bpp + (p / Ps) % bpp, p % Ps)) return false;
  }
  return true;
}

RadixNode* ShadowRadix::split(RadixNode* n, int64_t at) {
  const int64_t P = cfg_.page_tokens;
  const int64_t k = at - n->start;
  auto m = std::make_unique<RadixNode>();
  RadixNode* mp = m.get();
  mp->id = next_node_id_++;
  mp->parent = n->parent;
  mp->start = n->start;
  mp->tokens.assign(n->tokens.begin(), n->tokens.begin() + k);
  const int64_t first = n->start / P, m_last = (at - 1) / P, n_first = at / P;
  mp->pages.assign(n->pages.begin(), n->pages.begin() + (m_last - first + 1));
  for (int32_t p : mp->pages) pages_.ref(p);
  for (int64_t i = first; i < n_first; ++i) pages_.unref(n->pages[size_t(i - first)]);
  n->pages.erase(n->pages.begin(), n->pages.begin() + (n_first - first));
  mp->lock = n->lock;  // every sequence locking n locks its whole path
  mp->last_access = n->last_access;
  RadixNode* parent = n->parent;
  auto& slot = parent->children[n->tokens[0]];
  std::unique_ptr<RadixNode> nown = std::move(slot);
  n->tokens.erase(n->tokens.begin(), n->tokens.begin() + k);
  n->start = at;
  n->parent = mp;
  mp->children[n->tokens[0]] = std::move(nown);
  slot = std::move(m);
  return mp;
}

void ShadowRadix::release_boundary(RadixNode* n) {
  for (int64_t vb : n->swa_vblocks) swa_.unref(vb);
  n->swa_vblocks.clear();
  if (n->snapshot >= 0) snaps_.unref(n->snapshot);
  n->snapshot = -1;
}

void ShadowRadix::drop_leaf(RadixNode* n) {
  release_boundary(n);
  for (int32_t p : n->pages) pages_.unref(p);
  n->pages.clear();
  RadixNode* parent = n->parent;
  parent->children.erase(n->tokens[0]);  // destroys n
}

void ShadowRadix::touch(RadixNode* n) {
  const uint64_t t = ++clock_;
  for (RadixNode* x = n; x; x = x->parent) x->last_access = t;
}

void ShadowRadix::lock_path(RadixNode* n, int delta) {
  for (RadixNode* x = n; x && !x->is_root(); x = x->parent) x->lock += delta;
}

// ---- allocation with eviction ---------------------------------------------------------------

bool ShadowRadix::alloc_page(int32_t* out) {
  if (pages_.free_count() == 0 && !evict_impl({1, 0, 0})) return false;
  *out = *pages_.alloc();
  return true;
}

bool ShadowRadix::alloc_swa(int64_t vb) {
  if (swa_.pool().free_count() == 0 && !evict_impl({0, 1, 0})) return false;
  return swa_.alloc(vb);
}

bool ShadowRadix::alloc_snapshot(int32_t* out) {
  if (snaps_.free_count() == 0 && !evict_impl({0, 0, 1})) return false;
  *out = *snaps_.alloc();
  return true;
}

bool ShadowRadix::evict(const EvictNeed& need) {
  const bool ok = evict_impl(need);
  debug_check("evict");
  return ok;
}

void ShadowRadix::debug_check(const char* op) const {
#ifndef NDEBUG
  if (!cfg_.debug_checks) return;
  Status st = check_invariants();
  if (!st.ok()) {
    V4_LOG_ERROR("ShadowRadix::{}: {}\n{}", op, st.message(), debug_string());
    std::abort();
  }
#else
  (void)op;
#endif
}

bool ShadowRadix::evict_impl(const EvictNeed& need) {
  auto pages_ok = [&] { return pages_.free_count() >= need.pages; };
  auto state_ok = [&] {
    return swa_.pool().free_count() >= need.swa_pages && snaps_.free_count() >= need.snapshots;
  };
  if (pages_ok() && state_ok()) return true;
  // Phase 1: free boundary state (SWA window + snapshot) of cold nodes -> tombstones.
  if (!state_ok()) {
    std::vector<RadixNode*> cand;
    std::function<void(RadixNode*)> collect = [&](RadixNode* x) {
      if (!x->is_root() && x->snapshot >= 0 && x->swa_lock == 0) cand.push_back(x);
      for (auto& [t, c] : x->children) collect(c.get());
    };
    collect(root_.get());
    std::sort(cand.begin(), cand.end(), [](const RadixNode* a, const RadixNode* b) {
      return a->last_access != b->last_access ? a->last_access < b->last_access : a->id < b->id;
    });
    for (RadixNode* x : cand) {
      if (state_ok()) break;
      release_boundary(x);
      x->tombstone = true;
      ++counters_.tombstoned_nodes;
    }
  }
  // Phase 2: drop cold unlocked leaves entirely (their parents may become leaves in turn).
  if (!(pages_ok() && state_ok())) {
    auto older = [](const RadixNode* a, const RadixNode* b) {
      return a->last_access != b->last_access ? a->last_access > b->last_access : a->id > b->id;
    };
    std::priority_queue<RadixNode*, std::vector<RadixNode*>, decltype(older)> heap(older);
    std::function<void(RadixNode*)> collect = [&](RadixNode* x) {
      if (!x->is_root() && x->children.empty() && x->lock == 0) heap.push(x);
      for (auto& [t, c] : x->children) collect(c.get());
    };
    collect(root_.get());
    while (!heap.empty() && !(pages_ok() && state_ok())) {
      RadixNode* x = heap.top();
      heap.pop();
      RadixNode* parent = x->parent;
      drop_leaf(x);
      ++counters_.evicted_nodes;
      if (!parent->is_root() && parent->children.empty() && parent->lock == 0) heap.push(parent);
    }
  }
  return pages_ok() && state_ok();
}

// ---- scheduler API --------------------------------------------------------------------------

namespace {
struct Walk {
  int64_t R = 0, M = 0;
  RadixNode* node_R = nullptr;
  bool m_live = false;  // M is the end of a resumable node
  std::vector<int64_t> points;
};

Walk walk_tree(RadixNode* root, std::span<const int32_t> tokens, int64_t max_cached) {
  Walk w;
  w.node_R = root;
  RadixNode* cur = root;
  int64_t pos = 0;
  const int64_t n = int64_t(tokens.size());
  std::vector<std::pair<int64_t, bool>> ends;
  while (pos < n) {
    auto it = cur->children.find(tokens[size_t(pos)]);
    if (it == cur->children.end()) break;
    RadixNode* c = it->second.get();
    const int64_t len = int64_t(c->tokens.size());
    int64_t k = 0;
    while (k < len && pos + k < n && c->tokens[size_t(k)] == tokens[size_t(pos + k)]) ++k;
    pos += k;
    if (k < len) break;
    cur = c;
    ends.emplace_back(c->end(), c->resumable());
    if (c->resumable() && c->end() <= max_cached) {
      w.R = c->end();
      w.node_R = c;
    }
  }
  w.M = pos;
  for (auto [e, res] : ends) {
    if (e > w.R && !res) w.points.push_back(e);
    w.m_live |= (e == w.M && res);
  }
  if (w.M > w.R && !w.m_live && (w.points.empty() || w.points.back() != w.M))
    w.points.push_back(w.M);
  return w;
}
}  // namespace

MatchResult ShadowRadix::match(std::span<const int32_t> tokens, int64_t max_cached) const {
  MatchResult r;
  if (!cfg_.enable_prefix_cache) return r;
  Walk w = walk_tree(root_.get(), tokens, max_cached);
  r.cached_tokens = w.R;
  r.matched_tokens = w.M;
  r.snapshot_points = std::move(w.points);
  return r;
}

Status ShadowRadix::check_fits(int64_t total_tokens, int64_t chunk_tokens) const {
  const int64_t pages = n_page_idx(total_tokens) + 1;  // + a tail copy page
  if (pages > cfg_.n_pages)
    return make_error(ErrorCode::kInvalidArgument,
                      "request of {} tokens needs {} KV pages of {} tokens but the cache has only "
                      "{} pages ({} tokens); shorten the request or raise the KV cache budget",
                      total_tokens, pages, cfg_.page_tokens, cfg_.n_pages,
                      int64_t(cfg_.n_pages) * cfg_.page_tokens);
  const int64_t Ps = cfg_.swa_page_tokens;
  const int64_t chunk = std::max<int64_t>(1, std::min(chunk_tokens, total_tokens));
  const int64_t swa = (cfg_.window_tokens + chunk + Ps - 1) / Ps + 1;
  if (swa > cfg_.n_swa_pages)
    return make_error(ErrorCode::kInvalidArgument,
                      "a prefill chunk of {} tokens needs {} SWA pages of {} tokens (window {} + "
                      "chunk) but the SWA pool has only {}; lower the chunk size or raise the "
                      "budget",
                      chunk, swa, Ps, cfg_.window_tokens, cfg_.n_swa_pages);
  return Status::Ok();
}

int64_t thinned_snapshot_interval(int64_t interval, int64_t R, int64_t n, int32_t cap) {
  if (interval <= 0 || n <= 1 || R < 0 || R >= n - 1) return 0;
  cap = std::max<int32_t>(1, cap);
  int64_t iv = interval;
  // Multiples of iv in (R, n): (n − 1)/iv − R/iv. iv < n here, so doubling cannot overflow.
  while (iv < n && (n - 1) / iv - R / iv > cap) iv *= 2;
  return iv < n && (n - 1) / iv - R / iv > 0 ? iv : 0;
}

std::string describe_snapshot_interval(int64_t interval, int32_t cap, int32_t n_snapshots,
                                       int64_t max_prompt, bool* warn) {
  *warn = false;
  cap = std::max<int32_t>(1, cap);
  if (interval <= 0)
    return "prefix cache: --prefix-snapshot-interval 0: boundaries at branch points and prompt "
           "ends only";
  if (interval >= max_prompt) {
    *warn = true;
    return fmt::format(
        "prefix cache: --prefix-snapshot-interval {} has no effect: it is not below the context "
        "length ({} tokens), so no prompt contains a multiple of it (0 turns it off)",
        interval, max_prompt);
  }
  const int64_t worst = (max_prompt - 1) / interval;
  if (worst > cap) {
    *warn = true;
    const int64_t min_iv = (max_prompt - 1) / (int64_t(cap) + 1) + 1;  // (max_prompt−1)/iv <= cap
    return fmt::format(
        "prefix cache: --prefix-snapshot-interval {}: a prompt of up to {} tokens (the context "
        "length) would ask for {} boundaries but one prompt may take at most {} of the store's {} "
        "compressor snapshots (more would evict every other cached prefix and the prompt's own "
        "end: less caching than interval 0), so prompts longer than {} tokens get one every "
        "{}·2^k tokens (smallest k that fits); an interval >= {} is never thinned",
        interval, max_prompt, worst, cap, n_snapshots, (int64_t(cap) + 1) * interval, interval,
        min_iv);
  }
  return fmt::format(
      "prefix cache: --prefix-snapshot-interval {}: a boundary every {} prompt tokens (at most "
      "{} per prompt of up to {} tokens; the store keeps {} compressor snapshots)",
      interval, interval, worst, max_prompt, n_snapshots);
}

int32_t ShadowRadix::interval_point_cap() const {
  return cfg_.max_interval_points > 0 ? cfg_.max_interval_points
                                      : std::max<int32_t>(1, cfg_.n_snapshots / 4);
}

Result<AdmitPlan> ShadowRadix::admit(std::span<const int32_t> prompt, int64_t max_cached) {
  CheckOnExit<ShadowRadix> check_on_exit{this, "admit"};
  const int64_t P = cfg_.page_tokens, Ps = cfg_.swa_page_tokens, W = cfg_.window_tokens;
  Walk w;
  w.node_R = root_.get();
  if (cfg_.enable_prefix_cache) w = walk_tree(root_.get(), prompt, max_cached);
  const int64_t n = int64_t(prompt.size());
  if (n > 0 && (w.points.empty() || w.points.back() < n) && cfg_.enable_prefix_cache) {
    // Also keep the end of the prompt (a likely branch point), unless it is live already.
    const bool live = w.M == n && w.m_live;
    if (!live && n > w.R) w.points.push_back(n);
  }
  if (n > 1 && cfg_.enable_prefix_cache && n - 1 > w.R) {
    // And one token before it: the deepest point a request with the same prompt can resume at
    // (it needs the last token's logits, so match stops at n − 1 and a boundary at n never
    // serves an exact repeat). Costs one extra 1-token prefill step and a kept boundary.
    w.points.push_back(n - 1);
    std::sort(w.points.begin(), w.points.end());
    w.points.erase(std::unique(w.points.begin(), w.points.end()), w.points.end());
  }
  const int64_t iv =
      cfg_.enable_prefix_cache && n > 0
          ? thinned_snapshot_interval(cfg_.snapshot_interval, w.R, n, interval_point_cap())
          : 0;
  if (iv > 0) {
    // Periodic boundaries inside the prompt (ShadowRadixConfig::snapshot_interval, thinned so
    // that one prompt never asks for more than the store keeps). Every point in (R, n) is past
    // the deepest resumable boundary, so none is live already.
    for (int64_t p = w.R - w.R % iv + iv; p < n; p += iv) w.points.push_back(p);
    std::sort(w.points.begin(), w.points.end());
    w.points.erase(std::unique(w.points.begin(), w.points.end()), w.points.end());
  }
  ++counters_.match_queries;
  counters_.query_tokens += n;
  const int64_t R = w.R;
  RadixNode* node = w.node_R;
  // Lock first so that the eviction below can never take what we are about to use.
  lock_path(node, +1);
  if (!node->is_root()) node->swa_lock += 1;
  auto fail = [&](Status st) -> Status {
    lock_path(node, -1);
    if (!node->is_root()) node->swa_lock -= 1;
    return st;
  };
  const bool copy = R % P != 0;
  const int64_t page_start = (R / P) * P;
  int32_t need_swa = 0;
  if (copy)
    for (int64_t pb = std::max<int64_t>(page_start, R - W) / Ps; pb <= (R - 1) / Ps; ++pb)
      ++need_swa;
  if (!evict_impl({copy ? 1 : 0, need_swa, 0}))
    return fail(make_error(ErrorCode::kResourceExhausted,
                           "cache full: admitting needs {} page(s) and {} SWA page(s), free {} and "
                           "{}; held by running sequences, retry when one finishes",
                           copy ? 1 : 0, need_swa, pages_.free_count(),
                           swa_.pool().free_count()));
  auto s = std::make_unique<Seq>();
  s->id = next_seq_++;
  s->node = node;
  s->start = s->len = s->reserved = R;
  s->tokens.reserve(size_t(n - R));
  s->pt = path_page_table(node);
  s->pt.resize(size_t(n_page_idx(R)));
  for (int32_t p : s->pt) pages_.ref(p);
  s->own_from = R / P;
  AdmitPlan plan;
  if (copy) {
    const int32_t src = s->pt.back();
    int32_t dst = *pages_.alloc();  // evict() above made room
    s->pt.back() = dst;
    pages_.unref(src);
    plan.has_copy = true;
    plan.copy = {src, dst, R - page_start, std::max<int64_t>(0, R - W - page_start)};
  }
  if (R > 0) {
    s->win_lo = std::max<int64_t>(0, R - W) / Ps;
    s->win_hi = (R - 1) / Ps + 1;
    for (int64_t pb = s->win_lo; pb < s->win_hi; ++pb) {
      const int64_t vb = s->vblock(*this, pb);
      if (pb * Ps >= page_start && copy) {
        swa_.alloc(vb);  // room made above; fresh block of the copy page
        const int64_t src_vb = int64_t(plan.copy.src_page) * blocks_per_page() + vb % blocks_per_page();
        for (int64_t p = std::max(pb * Ps, R - W); p < std::min((pb + 1) * Ps, R); ++p)
          if (swa_.written(src_vb, p % Ps)) swa_.set_written(vb, p % Ps, p % Ps + 1);
      } else {
        swa_.ref(vb);  // shared block, live: kept by node's boundary window
      }
    }
  }
  touch(node);
  counters_.hit_tokens += R;
  plan.seq = s->id;
  plan.cached_tokens = R;
  plan.matched_tokens = w.M;
  plan.restore_snapshot = node->is_root() ? -1 : node->snapshot;
  plan.snapshot_points = std::move(w.points);
  seqs_[s->id] = std::move(s);
  return plan;
}

Status ShadowRadix::reserve(int32_t id, int64_t n_tokens) {
  CheckOnExit<ShadowRadix> check_on_exit{this, "reserve"};
  Seq* s = find_seq(id);
  if (!s) return make_error(ErrorCode::kInvalidArgument, "cache: unknown sequence {}", id);
  const int64_t target = s->len + n_tokens;
  if (target <= s->reserved) return Status::Ok();
  const int64_t Ps = cfg_.swa_page_tokens;
  const int32_t new_pages = int32_t(n_page_idx(target) - int64_t(s->pt.size()));
  const int64_t new_hi = (target - 1) / Ps + 1;
  const int32_t new_swa = int32_t(new_hi - s->win_hi);
  if (!evict_impl({new_pages, new_swa, 0}))
    return make_error(ErrorCode::kResourceExhausted,
                      "cache full: sequence {} needs {} page(s) and {} SWA page(s) for {} tokens, "
                      "free {} and {}",
                      id, new_pages, new_swa, n_tokens, pages_.free_count(),
                      swa_.pool().free_count());
  for (int32_t i = 0; i < new_pages; ++i) s->pt.push_back(*pages_.alloc());
  for (int64_t pb = s->win_hi; pb < new_hi; ++pb) swa_.alloc(s->vblock(*this, pb));
  s->win_hi = new_hi;
  s->reserved = target;
  return Status::Ok();
}

Status ShadowRadix::commit(int32_t id, std::span<const int32_t> tokens,
                           int64_t swa_rows_written) {
  CheckOnExit<ShadowRadix> check_on_exit{this, "commit"};
  Seq* s = find_seq(id);
  if (!s) return make_error(ErrorCode::kInvalidArgument, "cache: unknown sequence {}", id);
  const int64_t n = int64_t(tokens.size());
  if (s->len + n > s->reserved)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache: sequence {} commits {} tokens at {} but only {} are reserved", id, n,
                      s->len, s->reserved);
  s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
  {
    const int64_t Ps = cfg_.swa_page_tokens;
    const int64_t from = swa_rows_written < 0 ? s->len
                                              : std::max(s->len, s->len + n - swa_rows_written);
    for (int64_t p = from; p < s->len + n;) {
      const int64_t e = std::min(s->len + n, (p / Ps + 1) * Ps);
      swa_.set_written(s->vblock(*this, p / Ps), p % Ps, (e - 1) % Ps + 1);
      p = e;
    }
  }
  s->len += n;
  const int64_t new_lo =
      std::min(std::max<int64_t>(0, s->len - cfg_.window_tokens) / cfg_.swa_page_tokens,
               s->win_hi);
  for (int64_t pb = s->win_lo; pb < new_lo; ++pb) swa_.unref(s->vblock(*this, pb));
  s->win_lo = std::max(s->win_lo, new_lo);
  return Status::Ok();
}

Result<int32_t> ShadowRadix::begin_snapshot(int32_t id) {
  CheckOnExit<ShadowRadix> check_on_exit{this, "begin_snapshot"};
  Seq* s = find_seq(id);
  if (!s) return make_error(ErrorCode::kInvalidArgument, "cache: unknown sequence {}", id);
  if (s->len == 0)
    return make_error(ErrorCode::kInvalidArgument, "cache: sequence {} has no tokens yet", id);
  for (const auto& b : s->bounds)
    if (b.pos == s->len) return b.snap;
  int32_t snap = -1;
  if (!alloc_snapshot(&snap))
    return make_error(ErrorCode::kResourceExhausted,
                      "cache: no compressor-state snapshot slot free ({} in use by running "
                      "sequences)",
                      snaps_.used_count());
  Seq::Boundary b;
  b.pos = s->len;
  b.snap = snap;
  b.vblocks = window_vblocks(s->pt, s->len);
  for (int64_t vb : b.vblocks) swa_.ref(vb);  // live: inside the sequence's own window
  s->bounds.push_back(std::move(b));
  return snap;
}

int64_t ShadowRadix::insert_seq(Seq& s) {
  const int64_t n = s.len, Rb = s.start;
  if (n == Rb) return 0;
  // tok(p) for p >= Rb; the prefix [0, Rb) is the path to the locked node s.node, which is still
  // in the tree (locked) and still ends at Rb (splits keep the lower half's identity).
  auto tok = [&](int64_t p) { return s.tokens[size_t(p - Rb)]; };
  auto seq_bound = [&](int64_t pos) -> Seq::Boundary* {
    for (auto& b : s.bounds)
      if (b.pos == pos && b.snap >= 0) return &b;
    return nullptr;
  };
  // 1. Walk the common prefix, splitting at its end E and at this sequence's boundaries in
  //    (Rb, E) so that each can become a node end.
  std::vector<RadixNode*> path;
  RadixNode* cur = s.node;
  int64_t pos = Rb;
  while (pos < n) {
    auto it = cur->children.find(tok(pos));
    if (it == cur->children.end()) break;
    RadixNode* c = it->second.get();
    const int64_t len = int64_t(c->tokens.size());
    int64_t k = 0;
    while (k < len && pos + k < n && c->tokens[size_t(k)] == tok(pos + k)) ++k;
    // A boundary of ours strictly inside the matched part of c: cut there first.
    int64_t cut = -1;
    for (const auto& b : s.bounds)
      if (b.snap >= 0 && b.pos > std::max(Rb, c->start) && b.pos < c->start + k &&
          (cut < 0 || b.pos < cut))
        cut = b.pos;
    if (cut > 0) {
      c = split(c, cut);
      path.push_back(c);
      cur = c;
      pos = cut;
      continue;
    }
    if (k < len) {
      if (k > 0) {
        c = split(c, c->start + k);
        path.push_back(c);
        cur = c;
        pos += k;
      }
      break;
    }
    path.push_back(c);
    cur = c;
    pos += k;
  }
  const int64_t E = pos;
  // 2. Adoption: nodes on the path inside [Rb, E) were recomputed by this sequence. If one of
  //    them lacks live boundary state that we saved, they take our pages (same values: the
  //    computation is deterministic) so that our windows become the tree's windows.
  std::vector<RadixNode*> A;
  for (RadixNode* x : path)
    if (x->start >= Rb) A.push_back(x);
  bool want = false;
  for (RadixNode* x : A) want |= (x->snapshot < 0 && seq_bound(x->end()) != nullptr);
  if (want) {
    const int64_t P = cfg_.page_tokens;
    std::vector<std::vector<int32_t>> old(A.size());
    for (size_t i = 0; i < A.size(); ++i) {
      RadixNode* x = A[i];
      old[i] = x->pages;
      x->pages.assign(s.pt.begin() + x->start / P, s.pt.begin() + (x->end() - 1) / P + 1);
    }
    // Nodes whose window reads positions in [Rb, E): live ones in A's subtree, plus A nodes
    // that will take one of our boundaries.
    struct Re {
      RadixNode* x;
      std::vector<int64_t> vbs;
      Seq::Boundary* attach;
    };
    std::vector<Re> re;
    bool ok = true;
    std::function<void(RadixNode*)> visit = [&](RadixNode* x) {
      if (!ok || x->start >= E + cfg_.window_tokens) return;
      Seq::Boundary* b = nullptr;
      const bool in_a = std::find(A.begin(), A.end(), x) != A.end();
      if (x->snapshot < 0 && in_a) b = seq_bound(x->end());
      if ((x->snapshot >= 0 && x->end() - cfg_.window_tokens < E) || b) {
        auto xpt = window_page_table(x);
        auto vbs = window_vblocks(xpt, x->end());
        if (!window_written(xpt, x->end())) {
          if (b && x->snapshot < 0) {
            b = nullptr;  // cannot attach; not fatal
          } else {
            ok = false;
            return;
          }
        } else {
          re.push_back({x, std::move(vbs), b});
        }
      }
      for (auto& [t, c] : x->children) visit(c.get());
    };
    visit(A.front());
    if (ok) {
      for (size_t i = 0; i < A.size(); ++i) {
        for (int32_t p : A[i]->pages) pages_.ref(p);
        for (int32_t p : old[i]) pages_.unref(p);
      }
      for (auto& r : re) {
        for (int64_t vb : r.vbs) swa_.ref(vb);
        for (int64_t vb : r.x->swa_vblocks) swa_.unref(vb);
        r.x->swa_vblocks = std::move(r.vbs);
        if (r.attach) {
          r.x->snapshot = r.attach->snap;
          r.attach->snap = -1;  // the tree owns it now
          r.x->tombstone = false;
        }
      }
      counters_.adopted_nodes += int64_t(A.size());
    } else {
      for (size_t i = 0; i < A.size(); ++i) A[i]->pages = std::move(old[i]);
    }
  }
  // 3. New suffix [E, n): a chain of nodes cut at our boundaries.
  std::vector<int64_t> cuts;
  for (const auto& b : s.bounds)
    if (b.snap >= 0 && b.pos > E && b.pos < n) cuts.push_back(b.pos);
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(n);
  const int64_t P = cfg_.page_tokens;
  int64_t a = E;
  for (int64_t c : (E < n ? cuts : std::vector<int64_t>{})) {
    auto node = std::make_unique<RadixNode>();
    RadixNode* x = node.get();
    x->id = next_node_id_++;
    x->parent = cur;
    x->start = a;
    x->tokens.assign(s.tokens.begin() + (a - Rb), s.tokens.begin() + (c - Rb));
    x->pages.assign(s.pt.begin() + a / P, s.pt.begin() + (c - 1) / P + 1);
    for (int32_t p : x->pages) pages_.ref(p);
    cur->children[tok(a)] = std::move(node);
    if (Seq::Boundary* b = seq_bound(c)) {
      auto xpt = window_page_table(x);
      auto vbs = window_vblocks(xpt, c);
      if (window_written(xpt, c)) {
        for (int64_t vb : vbs) swa_.ref(vb);
        x->swa_vblocks = std::move(vbs);
        x->snapshot = b->snap;
        b->snap = -1;
      }
    }
    cur = x;
    a = c;
  }
  touch(cur);
  return E < n ? n - E : 0;
}

Result<int64_t> ShadowRadix::finish(int32_t id, bool insert) {
  CheckOnExit<ShadowRadix> check_on_exit{this, "finish"};
  Seq* s = find_seq(id);
  if (!s) return make_error(ErrorCode::kInvalidArgument, "cache: unknown sequence {}", id);
  int64_t added = 0;
  if (insert && cfg_.enable_prefix_cache) added = insert_seq(*s);
  for (int32_t p : s->pt) pages_.unref(p);
  for (int64_t pb = s->win_lo; pb < s->win_hi; ++pb) swa_.unref(s->vblock(*this, pb));
  for (auto& b : s->bounds) {
    for (int64_t vb : b.vblocks) swa_.unref(vb);
    if (b.snap >= 0) snaps_.unref(b.snap);
  }
  lock_path(s->node, -1);
  if (!s->node->is_root()) s->node->swa_lock -= 1;
  seqs_.erase(id);
  return added;
}

// ---- views ----------------------------------------------------------------------------------

std::span<const int32_t> ShadowRadix::page_table(int32_t id) const {
  const Seq* s = find_seq(id);
  if (!s) return {};
  return s->pt;
}

int64_t ShadowRadix::slot(int32_t id, int64_t pos) const {
  const Seq* s = find_seq(id);
  const int64_t P = cfg_.page_tokens;
  if (!s || pos < 0 || pos / P >= int64_t(s->pt.size())) return -1;
  return int64_t(s->pt[size_t(pos / P)]) * P + pos % P;
}

int64_t ShadowRadix::swa_row(int32_t id, int64_t pos) const {
  const int64_t sl = slot(id, pos);
  if (sl < 0) return -1;
  const int64_t Ps = cfg_.swa_page_tokens;
  const int32_t page = swa_.page(sl / Ps);
  return page < 0 ? -1 : int64_t(page) * Ps + pos % Ps;
}

int64_t ShadowRadix::seq_len(int32_t id) const {
  const Seq* s = find_seq(id);
  return s ? s->len : -1;
}

CacheStats ShadowRadix::stats() const {
  CacheStats st = counters_;
  st.pages_total = pages_.capacity();
  st.pages_used = pages_.used_count();
  st.swa_total = swa_.pool().capacity();
  st.swa_used = swa_.pool().used_count();
  st.snapshots_total = snaps_.capacity();
  st.snapshots_used = snaps_.used_count();
  st.running = int32_t(seqs_.size());
  st.nodes = st.tombstones = st.resumable = 0;
  st.tree_tokens = 0;
  std::function<void(const RadixNode*)> walk = [&](const RadixNode* x) {
    if (!x->is_root()) {
      ++st.nodes;
      st.tombstones += x->tombstone;
      st.resumable += x->snapshot >= 0;
      st.tree_tokens += int64_t(x->tokens.size());
    }
    for (const auto& [t, c] : x->children) walk(c.get());
  };
  walk(root_.get());
  return st;
}

// ---- invariants -----------------------------------------------------------------------------

Status ShadowRadix::check_invariants() const {
  const int64_t P = cfg_.page_tokens, Ps = cfg_.swa_page_tokens, W = cfg_.window_tokens;
  std::vector<int32_t> page_refs(size_t(pages_.capacity()), 0);
  std::vector<int32_t> swa_refs(size_t(swa_.n_vblocks()), 0);
  std::vector<int32_t> snap_refs(size_t(snaps_.capacity()), 0);
  std::unordered_map<const RadixNode*, std::pair<int32_t, int32_t>> locks;  // lock, swa_lock
  std::unordered_set<const RadixNode*> reachable;
  auto err = [](std::string m) { return Status(ErrorCode::kInternal, "cache invariant: " + m); };
  // Tree.
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* x = stack.back();
    stack.pop_back();
    reachable.insert(x);
    for (const auto& [t, c] : x->children) {
      if (c->parent != x) return err(fmt::format("node {} has a wrong parent", c->id));
      if (c->tokens.empty() || c->tokens[0] != t)
        return err(fmt::format("node {} keyed by token {} but starts with another", c->id, t));
      if (c->start != x->end())
        return err(fmt::format("node {} starts at {} but parent ends at {}", c->id, c->start,
                               x->end()));
      stack.push_back(c.get());
    }
    if (x->is_root()) {
      if (!x->tokens.empty() || !x->pages.empty() || x->snapshot >= 0 || x->lock || x->swa_lock)
        return err("root holds state");
      continue;
    }
    const int64_t want_pages = (x->end() - 1) / P - x->start / P + 1;
    if (int64_t(x->pages.size()) != want_pages)
      return err(fmt::format("node {} [{}, {}) has {} pages, expected {}", x->id, x->start,
                             x->end(), x->pages.size(), want_pages));
    for (int32_t p : x->pages) {
      if (p < 0 || p >= pages_.capacity()) return err(fmt::format("node {} bad page", x->id));
      ++page_refs[size_t(p)];
    }
    if (x->tombstone && (x->snapshot >= 0 || !x->swa_vblocks.empty()))
      return err(fmt::format("tombstoned node {} still holds SWA or a snapshot", x->id));
    if ((x->snapshot >= 0) != !x->swa_vblocks.empty())
      return err(fmt::format("node {}: snapshot and SWA window must come together", x->id));
    if (x->snapshot >= 0) {
      ++snap_refs[size_t(x->snapshot)];
      auto xpt = path_page_table(x);
      auto want = window_vblocks(xpt, x->end());
      if (!window_written(xpt, x->end()))
        return err(fmt::format("node {}: kept window has unwritten rows", x->id));
      if (want != x->swa_vblocks)
        return err(fmt::format("node {}: kept window is not the tree's window at {}", x->id,
                               x->end()));
      for (int64_t vb : x->swa_vblocks) {
        if (swa_.page(vb) < 0) return err(fmt::format("node {}: window block dead", x->id));
        ++swa_refs[size_t(vb)];
      }
    }
    if (x->swa_lock > 0 && x->snapshot < 0)
      return err(fmt::format("node {}: a running sequence resumed here but its boundary state "
                             "was freed",
                             x->id));
    if (x->swa_lock > x->lock)
      return err(fmt::format("node {}: swa_lock {} > lock {}", x->id, x->swa_lock, x->lock));
  }
  // Sequences.
  for (const auto& [id, sp] : seqs_) {
    const Seq& s = *sp;
    if (!reachable.count(s.node))
      return err(fmt::format("seq {}: its locked node was evicted", id));
    if (s.node->end() != s.start) return err(fmt::format("seq {}: locked node moved", id));
    for (const RadixNode* x = s.node; x && !x->is_root(); x = x->parent) ++locks[x].first;
    if (!s.node->is_root()) ++locks[s.node].second;
    if (int64_t(s.tokens.size()) != s.len - s.start || s.len > s.reserved || s.len < s.start)
      return err(fmt::format("seq {}: token counts inconsistent", id));
    if (int64_t(s.pt.size()) != n_page_idx(s.reserved))
      return err(fmt::format("seq {}: page table size {} for {} tokens", id, s.pt.size(),
                             s.reserved));
    for (size_t i = 0; i < s.pt.size(); ++i) {
      ++page_refs[size_t(s.pt[i])];
      if (int64_t(i) >= s.own_from && pages_.refcount(s.pt[i]) != 1)
        return err(fmt::format("seq {}: own page {} is shared", id, s.pt[i]));
    }
    const int64_t want_lo = std::max<int64_t>(0, s.len - W) / Ps;
    if (s.reserved > 0 && (s.win_lo > want_lo || s.win_hi * Ps < s.reserved))
      return err(fmt::format("seq {}: window [{}, {}) does not cover [{}, {})", id,
                             s.win_lo * Ps, s.win_hi * Ps, std::max<int64_t>(0, s.len - W),
                             s.reserved));
    for (int64_t pb = s.win_lo; pb < s.win_hi; ++pb) {
      const int64_t vb = s.vblock(*this, pb);
      if (swa_.page(vb) < 0) return err(fmt::format("seq {}: window block dead", id));
      ++swa_refs[size_t(vb)];
    }
    for (const auto& b : s.bounds) {
      for (int64_t vb : b.vblocks) {
        if (swa_.page(vb) < 0) return err(fmt::format("seq {}: boundary block dead", id));
        ++swa_refs[size_t(vb)];
      }
      if (b.snap >= 0) ++snap_refs[size_t(b.snap)];
    }
  }
  // Locks equal the running sequences.
  for (const RadixNode* x : reachable) {
    auto it = locks.find(x);
    const auto want = it == locks.end() ? std::pair<int32_t, int32_t>{0, 0} : it->second;
    if (x->lock != want.first || x->swa_lock != want.second)
      return err(fmt::format("node {}: lock {}/{} but running sequences hold {}/{}", x->id,
                             x->lock, x->swa_lock, want.first, want.second));
  }
  // Reference counts equal holders; free + used = total.
  int32_t used = 0;
  for (int32_t p = 0; p < pages_.capacity(); ++p) {
    if (pages_.refcount(p) != page_refs[size_t(p)])
      return err(fmt::format("page {}: refcount {} but {} holders", p, pages_.refcount(p),
                             page_refs[size_t(p)]));
    used += page_refs[size_t(p)] > 0;
  }
  if (used != pages_.used_count() || pages_.used_count() + pages_.free_count() != pages_.capacity())
    return err("page pool: free + used != total");
  int32_t swa_used = 0;
  std::vector<char> swa_seen(size_t(swa_.pool().capacity()), 0);
  for (int64_t vb = 0; vb < swa_.n_vblocks(); ++vb) {
    if (swa_.refcount(vb) != swa_refs[size_t(vb)])
      return err(fmt::format("SWA block {}: refcount {} but {} holders", vb, swa_.refcount(vb),
                             swa_refs[size_t(vb)]));
    const int32_t sp = swa_.page(vb);
    if ((sp >= 0) != (swa_refs[size_t(vb)] > 0))
      return err(fmt::format("SWA block {}: mapped {} with {} holders", vb, sp,
                             swa_refs[size_t(vb)]));
    if (sp >= 0) {
      if (swa_seen[size_t(sp)]++) return err(fmt::format("SWA page {} mapped twice", sp));
      if (page_refs[size_t(vb / blocks_per_page())] == 0)
        return err(fmt::format("SWA block {} outlives its virtual page", vb));
      ++swa_used;
    }
  }
  if (swa_used != swa_.pool().used_count() ||
      swa_.pool().used_count() + swa_.pool().free_count() != swa_.pool().capacity())
    return err("SWA pool: free + used != total");
  int32_t snap_used = 0;
  for (int32_t i = 0; i < snaps_.capacity(); ++i) {
    if (snaps_.refcount(i) != snap_refs[size_t(i)])
      return err(fmt::format("snapshot {}: refcount {} but {} holders", i, snaps_.refcount(i),
                             snap_refs[size_t(i)]));
    snap_used += snap_refs[size_t(i)] > 0;
  }
  if (snap_used != snaps_.used_count()) return err("snapshot pool: free + used != total");
  return Status::Ok();
}

std::string ShadowRadix::debug_string() const {
  std::string out;
  std::function<void(const RadixNode*, int)> walk = [&](const RadixNode* x, int depth) {
    out += fmt::format("{:{}}node {} [{}, {}) pages {} snap {} swa {} lock {}/{}{}\n", "",
                       depth * 2, x->id, x->start, x->end(), fmt::join(x->pages, ","),
                       x->snapshot, x->swa_vblocks.size(), x->lock, x->swa_lock,
                       x->tombstone ? " tombstone" : "");
    for (const auto& [t, c] : x->children) walk(c.get(), depth + 1);
  };
  walk(root_.get(), 0);
  return out;
}

}  // namespace v4::cache
