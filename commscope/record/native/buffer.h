// The record buffer: the shared State (the spool's ring and tables), its lock (RecordLock, Recording) and the
// appends made under it.  Apart from the kernel: the kernel, the wrappers, the drain and the spools all use it.

#pragma once

namespace {

inline int64_t now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return int64_t(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

inline uint64_t thread_id() { return uint64_t(pthread_self()); }

// ---------------------------------------------------------------- byte buffers
// A growable byte buffer that never zero-fills what it hands out (std::vector::resize
// does, and is an out-of-line call per record on the hot path).
struct ByteBuf {
  uint8_t* p = nullptr;
  size_t n = 0, cap = 0;
  ByteBuf() = default;
  ByteBuf(const ByteBuf&) = delete;
  ByteBuf& operator=(const ByteBuf&) = delete;
  ~ByteBuf() { std::free(p); }
  uint8_t* data() { return p; }
  const uint8_t* data() const { return p; }
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  size_t capacity() const { return cap; }
  void clear() { n = 0; }
  bool reserve(size_t c) {
    if (c <= cap) return true;
    void* q = std::realloc(p, c);
    if (q == nullptr) return false;
    p = static_cast<uint8_t*>(q);
    cap = c;
    return true;
  }
  // k more bytes at the end (uninitialised), or nullptr when memory ran out.
  uint8_t* grow(size_t k) {
    if (n + k > cap && !reserve(std::max(cap * 2, std::max(n + k, size_t(256))))) return nullptr;
    uint8_t* at = p + n;
    n += k;
    return at;
  }
  void swap(ByteBuf& o) {
    std::swap(p, o.p);
    std::swap(n, o.n);
    std::swap(cap, o.cap);
  }
};

// ---------------------------------------------------------------- the lock
// The records' lock: taken two to four times per op, nearly always free.  Free and held
// are one atomic instruction each, inline (a pthread mutex is two library calls and ~45
// instructions per round trip); a thread that finds it held spins briefly, then sleeps on
// a futex (Drepper, "Futexes Are Tricky", mutex 2).  Usable with std::lock_guard.
class RecordLock {
  std::atomic<int> v_{0};  // 0 free, 1 held, 2 held and someone may sleep on it
  void lock_slow() {
    int c = v_.load(std::memory_order_relaxed);
    for (int spin = 0; spin < 100; spin++) {
      if (c == 0 && v_.compare_exchange_weak(c, 1, std::memory_order_acquire, std::memory_order_relaxed)) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      c = v_.load(std::memory_order_relaxed);
    }
    if (c != 2) c = v_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
      syscall(SYS_futex, reinterpret_cast<int*>(&v_), FUTEX_WAIT_PRIVATE, 2, nullptr, nullptr, 0);
      c = v_.exchange(2, std::memory_order_acquire);
    }
  }

 public:
  void lock() {
    int c = 0;
    if (__builtin_expect(!v_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed), 0))
      lock_slow();
  }
  void unlock() {
    if (__builtin_expect(v_.exchange(0, std::memory_order_release) == 2, 0))
      syscall(SYS_futex, reinterpret_cast<int*>(&v_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }
};
static_assert(sizeof(std::atomic<int>) == sizeof(int), "futex word");

// ---------------------------------------------------------------- shared state
struct Inflight {
  int64_t ts;
  uint64_t tid;
  uint64_t parent;
  bool waiting;
  bool reported;
};

// Ops in flight: few at a time (one per thread, plus async work being waited on), so a
// flat vector searched from the back beats a node-allocating hash map on the hot path.
struct InflightTable {
  std::vector<std::pair<uint64_t, Inflight>> items;
  void put(uint64_t id, const Inflight& f) {
    for (auto it = items.rbegin(); it != items.rend(); ++it)
      if (it->first == id) {
        it->second = f;
        return;
      }
    items.emplace_back(id, f);
  }
  void erase(uint64_t id) {
    for (size_t i = items.size(); i-- > 0;)
      if (items[i].first == id) {
        items[i] = items.back();
        items.pop_back();
        return;
      }
  }
  bool contains(uint64_t id) const {
    for (const auto& p : items)
      if (p.first == id) return true;
    return false;
  }
  size_t size() const { return items.size(); }
  void clear() { items.clear(); }
};

struct GroupEntry {
  int32_t gid;
  std::string name;
};

// Work whose completion the thread polls (non-blocking): CUDA work (its future completes at
// enqueue), work without a future, and a synchronous CUDA op that returned no work (NCCL
// with asyncOp=false runs on the caller's stream): timed by our own event pair on that stream.
struct PendingDevice {
  c10::intrusive_ptr<c10d::Work> work;  // null for an event pair
  uint64_t id;
  uint8_t role;
  bool device = true;
  std::unique_ptr<c10::Event> start, end;  // the pair, when there is no work
};

struct State {
  RecordLock mu;
  // The spool (see SpoolHeader): records go to ring[pos & ring_mask].
  SpoolHeader* hdr = nullptr;
  uint8_t* ring = nullptr;
  uint64_t ring_mask = 0;
  uint8_t* table = nullptr;
  size_t map_size = 0;
  bool map_file = false;         // hdr maps a spool file (else anonymous memory)
  uint64_t staged = 0;           // head, counting records written in the current locked region
  uint64_t published = 0;        // what hdr->head says
  uint64_t limit = 0;            // bytes of the ring in use at most (set_capacity; <= ring size)
  uint64_t drained = 0;          // the thread has encoded records up to here
  uint64_t taken = 0;            // the last drain took records up to here (read without the lock)
  // take_groups() fixes where the next drain_block ends (``published`` then): every group
  // its records use was registered by then, and told its members before the block is built
  uint64_t cut = 0;
  bool cut_set = false;
  uint64_t dropped = 0;          // records that did not fit, since the last drain
  uint64_t dropped_total = 0;
  uint64_t table_dropped = 0;    // table records that did not fit the spool's table region
  std::atomic<uint64_t> next_id{1};
  // groups
  std::unordered_map<const void*, GroupEntry> gid_by_pg;
  std::unordered_map<std::string, int32_t> gid_by_name;
  std::vector<std::pair<int32_t, std::string>> new_groups;
  // sequence numbers: per group for collectives, per (group, peer, direction) for p2p
  std::vector<int64_t> coll_seq;  // by group id (dense, small)
  std::map<std::tuple<int32_t, int32_t, int8_t>, int64_t> p2p_seq;
  InflightTable inflight;
  std::vector<PendingDevice> device_pending;
  std::vector<std::unique_ptr<c10::Event>> event_pool;  // timing events whose pair completed
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> resolved_source;  // any-source recv id -> (peer, seq)
  std::unordered_set<uint64_t> open_nested;  // nested ops not ended yet
  int64_t last_failed_ns = 0;                // when an op (or a wait) last raised
  std::unordered_map<std::string, uint32_t> sigs;  // signature bytes -> id (see REC_SIG)
  // The table records by id, as restated at the head of each block (and kept in the
  // spool's table region for the forwarder).
  std::vector<std::string> sig_recs, site_recs, group_recs;
  std::vector<uint32_t> sig_mark, site_mark, group_mark;  // the drain that last restated each
  uint32_t drain_no = 0;
  uint64_t block_texts = 0;  // text records (error messages) in the last block built
  ByteBuf scratch;  // the drain's block, reused tick after tick
  std::string group_suffix;  // added to group names from the second incarnation on
};

State* S = nullptr;  // never freed: backend threads may complete futures during exit
uint64_t g_limit_cfg = ~0ULL;  // set_capacity's wish, kept across spools

// ---------------------------------------------------------------- ring writes (under S->mu)
// The records' lock, publishing on release what was written while it was held: a record
// is whole before ``head`` moves past it, so a spool read after any death holds only
// whole records.
struct Recording {
  Recording() { S->mu.lock(); }
  ~Recording() {
    if (S->staged != S->published) {
      S->published = S->staged;
      S->hdr->head.store(S->staged, std::memory_order_release);
    }
    S->mu.unlock();
  }
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
};

inline uint8_t* reserve(size_t n) {
  const uint64_t head = S->staged;
  if (__builtin_expect(head + n - S->hdr->tail.load(std::memory_order_relaxed) > S->limit || n > kMaxRecord, 0)) {
    S->dropped++;
    S->dropped_total++;
    S->hdr->dropped.store(S->dropped_total, std::memory_order_relaxed);
    return nullptr;
  }
  S->staged = head + n;
  return S->ring + (head & S->ring_mask);
}

// A table record (SIG, SITE, GROUP, META): kept by id for the blocks that restate it, and
// appended to the spool's table region for the forwarder (a later record of the same
// id replaces an earlier one).  Under S->mu.
void table_put(std::vector<std::string>& recs, std::vector<uint32_t>* marks, size_t id, std::string rec) {
  SpoolHeader* h = S->hdr;
  const uint64_t used = h->table_used.load(std::memory_order_relaxed);
  if (used + rec.size() <= h->table_size) {
    std::memcpy(S->table + used, rec.data(), rec.size());
    h->table_used.store(used + rec.size(), std::memory_order_release);
  } else {
    S->table_dropped++;
  }
  if (id >= recs.size()) {
    recs.resize(id + 1);
    if (marks != nullptr) marks->resize(id + 1, 0);
  }
  recs[id] = std::move(rec);
}

inline void put_header(uint8_t* p, uint8_t type, uint8_t flags, uint32_t len, int64_t ts, uint64_t id,
                       uint16_t aux = 0) {
  Header h{type, flags, aux, len, ts, id};
  std::memcpy(p, &h, sizeof h);
}

// How many of a text's n bytes are kept in max bytes, and whether it ends in kCutMark: all
// of one that fits max; of a longer one, its whole words before byte max - kCutMarkLen (so
// that they and the mark fit max). The word the cut falls in is dropped whole: a text's
// credentials are masked later, in Python, when its block is drained (blocks.mask_line) or
// its spool read (std::terminate's what(), death.h), and half of one is no longer
// recognisable there (a URL's password without the "@host" after it, a token's first
// half). Records pass kMaxText, the terminate handler sizeof term_what (max > kCutMarkLen,
// or the mark would not fit). Allocates nothing and cannot throw (the terminate handler
// calls it).
inline bool cut_text(const char* text, size_t n, size_t max, size_t* keep) noexcept {
  if (n <= max) {
    *keep = n;
    return false;
  }
  size_t k = max > kCutMarkLen ? max - kCutMarkLen : 0;
  while (k > 0 && !(text[k] == ' ' || text[k] == '\t' || text[k] == '\n' || text[k] == '\r' ||
                    text[k] == '\v' || text[k] == '\f'))
    k--;
  *keep = k;  // (text[k] is a space, or nothing is kept: a text of one long word)
  return true;
}

void write_text_record(uint8_t type, uint8_t flags, int64_t ts, uint64_t id, const char* text, size_t n) {
  size_t keep = 0;
  const bool cut = cut_text(text, n, kMaxText, &keep);
  const size_t total = keep + (cut ? kCutMarkLen : 0);
  size_t len = sizeof(Header) + 2 + total;
  uint8_t* p = reserve(len);
  if (!p) return;
  put_header(p, type, flags, uint32_t(len), ts, id);
  uint16_t n16 = uint16_t(total);
  std::memcpy(p + sizeof(Header), &n16, 2);
  if (keep) std::memcpy(p + sizeof(Header) + 2, text, keep);
  if (cut) std::memcpy(p + sizeof(Header) + 2 + keep, kCutMark, kCutMarkLen);
}

// A table record: header (ts 0, id) and body.
std::string table_record(uint8_t type, uint64_t id, const std::string& body) {
  std::string rec(sizeof(Header) + body.size(), '\0');
  Header h{type, 0, 0, uint32_t(rec.size()), 0, id};
  std::memcpy(&rec[0], &h, sizeof h);
  if (!body.empty()) std::memcpy(&rec[sizeof h], body.data(), body.size());
  return rec;
}

void put_u16_text(std::string& out, const char* text, size_t n) {
  if (n > 0xFFFF) n = 0xFFFF;
  uint16_t n16 = uint16_t(n);
  out.append(reinterpret_cast<const char*>(&n16), 2);
  out.append(text, n);
}

// put_u16_text of a text cut as write_text_record cuts one (cut_text).
void put_u16_cut_text(std::string& out, const char* text, size_t n) {
  size_t keep = 0;
  const bool cut = cut_text(text, n, kMaxText, &keep);
  uint16_t n16 = uint16_t(keep + (cut ? kCutMarkLen : 0));
  out.append(reinterpret_cast<const char*>(&n16), 2);
  out.append(text, keep);
  if (cut) out.append(kCutMark, kCutMarkLen);
}

// A group's global ranks as (start, stride, length) runs, in order (blocks.runs_of splits
// them the same way).
std::vector<int32_t> group_runs(const std::vector<int32_t>& g) {
  std::vector<int32_t> out;
  size_t i = 0, n = g.size();
  while (i < n) {
    if (i + 1 == n) {
      out.insert(out.end(), {g[i], 1, 1});
      break;
    }
    const int64_t stride = int64_t(g[i + 1]) - g[i];
    size_t j = i + 1;
    while (j + 1 < n && int64_t(g[j + 1]) - g[j] == stride) j++;
    out.insert(out.end(), {g[i], int32_t(stride), int32_t(j - i + 1)});
    i = j + 1;
  }
  return out;
}

// A GROUP record: the name (and, once Python has told them, backend and global ranks).
// Every block restates the groups it uses, so members go as runs (kGroupRuns, then the run
// count and the runs) where that is shorter: a world of 16k ranks is 16 bytes, not 64k.
constexpr int32_t kGroupRuns = -2;
void put_group_locked(int32_t gid, const std::string& name, const std::string& backend,
                      const std::vector<int32_t>* granks) {
  std::string body;
  const std::string shown = name + S->group_suffix;
  put_u16_text(body, shown.data(), shown.size());
  put_u16_text(body, backend.data(), backend.size());
  int32_t n = granks == nullptr ? -1 : int32_t(granks->size());
  std::vector<int32_t> runs;
  if (granks != nullptr) runs = group_runs(*granks);
  if (granks != nullptr && 4 + 4 * runs.size() < 4 * size_t(n)) {
    int32_t head[2] = {kGroupRuns, int32_t(runs.size() / 3)};
    body.append(reinterpret_cast<const char*>(head), 8);
    body.append(reinterpret_cast<const char*>(runs.data()), 4 * runs.size());
  } else {
    body.append(reinterpret_cast<const char*>(&n), 4);
    if (granks != nullptr && n > 0) body.append(reinterpret_cast<const char*>(granks->data()), 4 * size_t(n));
  }
  table_put(S->group_recs, &S->group_mark, size_t(gid), table_record(REC_GROUP, uint64_t(gid), body));
}

int32_t new_group_locked(const std::string& name) {
  int32_t gid = int32_t(S->gid_by_name.size());
  S->gid_by_name.emplace(name, gid);
  S->new_groups.emplace_back(gid, name);
  put_group_locked(gid, name, std::string(), nullptr);
  return gid;
}

int32_t group_id_locked(const c10d::ProcessGroup* pg) {
  auto it = S->gid_by_pg.find(pg);
  const std::string& name = pg->getGroupName();
  if (it != S->gid_by_pg.end() && it->second.name == name) return it->second.gid;
  auto nit = S->gid_by_name.find(name);
  int32_t gid = nit == S->gid_by_name.end() ? new_group_locked(name) : nit->second;
  S->gid_by_pg[pg] = GroupEntry{gid, name};
  return gid;
}

int32_t group_id_by_name_locked(const std::string& name) {
  auto nit = S->gid_by_name.find(name);
  return nit != S->gid_by_name.end() ? nit->second : new_group_locked(name);
}

int64_t next_seq_locked(int32_t gid, Dir dir, int32_t peer) {
  if (dir == DIR_NONE) {
    auto& seqs = S->coll_seq;
    if (size_t(gid) >= seqs.size()) seqs.resize(size_t(gid) + 1, 0);
    return ++seqs[size_t(gid)];
  }
  if (peer < 0) return -1;  // any-source recv: numbered once its source is known
  return ++S->p2p_seq[std::make_tuple(gid, peer, int8_t(dir == DIR_SEND ? DIR_SEND : DIR_RECV))];
}

constexpr uint64_t kNoPos = ~0ULL;

// An op the backend refused as it was called (its dispatch raised before issuing anything)
// was never issued: its sequence number ``seq`` goes back, unless a later op of the same
// counter took one meanwhile (another thread: then the number stays, the gap with it).  Its
// BEGIN (at ring position ``pos``: kNoPos if it was dropped) then says seq -1, unless a drain
// has taken it already (readers then see the number; the END's FLAG_UNISSUED still says what
// happened).  Returns whether the number went back.  Under S->mu.
bool unissue_locked(int32_t gid, Dir dir, int32_t peer, int64_t seq, uint64_t id, uint64_t pos) {
  if (seq < 0 || gid < 0) return false;
  int64_t* counter = nullptr;
  if (dir == DIR_NONE) {
    if (size_t(gid) < S->coll_seq.size()) counter = &S->coll_seq[size_t(gid)];
  } else if (peer >= 0) {
    auto it = S->p2p_seq.find(std::make_tuple(gid, peer, int8_t(dir == DIR_SEND ? DIR_SEND : DIR_RECV)));
    if (it != S->p2p_seq.end()) counter = &it->second;
  }
  if (counter == nullptr || *counter != seq) return false;
  --*counter;
  if (pos == kNoPos || pos < S->taken || pos < S->hdr->tail.load(std::memory_order_relaxed) ||
      pos + sizeof(Header) > S->staged)
    return true;
  uint8_t* r = S->ring + (pos & S->ring_mask);  // no drain reads it yet: changed under the lock
  Header h;
  std::memcpy(&h, r, sizeof h);
  if (h.id != id) return true;
  const int64_t none = -1;
  if (h.type == REC_BEGIN_SIG && h.len >= sizeof(Header) + sizeof(SigBeginBody))
    std::memcpy(r + sizeof(Header) + offsetof(SigBeginBody, seq), &none, 8);
  else if (h.type == REC_BEGIN && h.len >= sizeof(Header) + sizeof(BeginBody))
    std::memcpy(r + sizeof(Header) + offsetof(BeginBody, seq), &none, 8);
  return true;
}

}  // namespace
