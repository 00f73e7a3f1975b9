// commscope's native recorder: one observer of every c10d collective, and the thin
// wrappers that give those collectives their Python names and call sites.
//
// Every ProcessGroup collective, whoever issues it (Python's torch.distributed, DDP's C++
// reducer, functional collectives of DTensor and torch.compile, FSDP), is dispatched
// through a ``c10d::*`` operator.  A boxed kernel registered at the BackendSelect key (in
// every dispatch key set, below Python modes, so fake tensors never reach it) sees each
// of them, notes what it moves, and redispatches.  Completion comes from the Work's
// future (CPU backends) or from polling the Work (CUDA), never from a host sync.
//
// The Python-facing wrappers (``Wrapper``, ``WaitWrapper``) are C callables: they record
// which torch.distributed function the user called and from where, in thread-local
// state, and the kernel folds that into the record of the first collective the call
// dispatches.  Everything is appended as fixed-layout binary records to one bounded
// buffer; the recorder thread takes the whole buffer at once and the trace readers
// decode it (commscope/record/blocks.py documents the layout).  No Python object is
// touched without the GIL: the kernel runs with the GIL released.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
// CPython 3.11: the call site is read from the interpreter's own frames, so the hot path
// never materializes a frame object (an allocation, and a copy when the frame exits).
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#define COMMSCOPE_INTERPRETER_FRAMES 1
#endif

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cxxabi.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <typeinfo>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

// ---------------------------------------------------------------- record layout
// Keep in sync with commscope/record/blocks.py.
enum RecType : uint8_t {
  REC_BEGIN = 1,   // an op began (a collective, or a logical op without one)
  REC_END = 2,     // an op ended (returned, or completed for ops that end at completion)
  REC_WAIT_BEGIN = 3,
  REC_WAIT_END = 4,
  REC_DONE = 5,    // device-side completion (CUDA): gpu time
  REC_RBEGIN = 6,  // a logical op described by Python (varlen, batch): JSON fragment
  REC_SOURCE = 7,  // an any-source recv learned its peer (and seq)
  REC_SIG = 8,     // a begin's repeating part (a BeginBody without ts/id/seq/parent/tid), by id
  REC_BEGIN_SIG = 9,  // an op began: its signature id and what changes each call
  // Table records: what the ring's records refer to by id.  Kept in the spool's table
  // region and restated at the head of every block that refers to them (never in the ring).
  REC_SITE = 10,   // id: site id; u16 length, "file:line in function"
  REC_GROUP = 11,  // id: group id; u16 name length, name, u16 backend length, backend,
                   // i32 ranks (-1: not known yet), i32 global rank by group rank
  REC_META = 12,   // the rank's meta event, JSON (spool table only: for the forwarder)
  REC_EVENT = 13,  // an event the store did not take at exit, JSON (spool table only)
};

// BEGIN roles: how the op relates to the logical op around it.
enum Role : uint8_t {
  ROLE_TOP = 0,        // issued outside any wrapped call (C++: DDP, functional collectives)
  ROLE_MERGED = 1,     // the collective of a wrapped torch.distributed call: one op, Python's name
  ROLE_ANNOTATED = 2,  // a collective inside a call that lends it its call site (torch internals)
  ROLE_NESTED = 3,     // further traffic inside a logical op
  ROLE_CHILD = 4,      // a p2p op of a container (batch_isend_irecv): own seq, parent set
  ROLE_LOGICAL = 5,    // a wrapped call that dispatched no collective (it failed before)
};

enum Kind : uint8_t { KIND_PLAIN = 0, KIND_ANNOTATE = 1, KIND_RICH = 2, KIND_CONTAINER = 3 };

enum Flag : uint8_t { FLAG_ERROR = 1, FLAG_APPROX = 2, FLAG_ASYNC = 4, FLAG_ENDS_AT_COMPLETION = 8 };

#pragma pack(push, 1)
struct Header {
  uint8_t type;
  uint8_t flags;
  uint16_t aux;
  uint32_t len;  // whole record, header included
  int64_t ts;
  uint64_t id;
};
struct BeginBody {
  uint64_t tid;
  uint64_t parent;
  int32_t name;   // wrapper name id, -1: the collective's own name
  int32_t site;   // call site id, -1: none
  int32_t opcode; // c10d operator id, -1: none
  int32_t gid;    // group id, -1: none
  int64_t seq;    // -1: none
  int32_t peer;   // group rank, -1: none
  int32_t root;   // group rank, -1: none
  int16_t redop;  // -1: none
  uint8_t role;
  int8_t device;  // CUDA device index, -1: not a CUDA op
  uint16_t nin;
  uint16_t nout;
  uint32_t ntensors_in;   // tensors really passed (nin/nout may be capped)
  uint32_t ntensors_out;
  int64_t bytes_in;
  int64_t bytes_out;
};
struct SigBeginBody {
  uint32_t sig;
  int64_t seq;
  uint64_t parent;
  uint64_t tid;
};
struct DoneBody {
  int64_t gpu_ns;
};
struct SourceBody {
  int32_t peer;
  int64_t seq;
};
#pragma pack(pop)
// The packed layout, as commscope/blocks.py reads it (tests/test_optable.py compares these
// sizes with blocks' struct formats): a change on one side fails the build or that test.
static_assert(sizeof(Header) == 24, "blocks.HEADER");
static_assert(sizeof(BeginBody) == 80, "blocks.BEGIN_BODY");
static_assert(sizeof(SigBeginBody) == 28, "blocks.SIG_BEGIN_BODY");
static_assert(sizeof(DoneBody) == 8, "blocks.DONE_BODY");
static_assert(sizeof(SourceBody) == 12, "blocks.SOURCE_BODY");

constexpr size_t kMaxTensorsDescribed = 256;
constexpr size_t kMaxText = 4096;
// No ring record is larger than this: it is the spool's slack (see SpoolHeader), so a
// record near the ring's end runs on into the slack instead of wrapping.
constexpr size_t kMaxRecord = 64u << 10;
constexpr size_t kMaxDescribedBytes = 24u << 10;  // tensor descriptions per side of one record

// ---------------------------------------------------------------- the spool
// The records live in a spool: a ring of records with a header and a table region,
// in a file the recorder maps (commscope/store/spool.py creates it in a local spool
// directory) or, until one is attached, in anonymous memory.  A record is written, then
// ``head`` moves past it; the recorder thread encodes what lies between its drain mark
// and ``head`` and, once the store has it, moves ``tail`` (the store holds everything
// before ``tail``).  Because the file outlives the process, a rank killed outright
// (SIGKILL, the OOM killer) or dying of a fatal signal loses nothing: whoever finds
// the spool of a dead rank forwards ``[tail, head)`` (spool.py).  Positions grow for
// ever; a record at position p sits at ring offset p mod ring_size, contiguous, running
// on into the slack past the ring's end if it must (so no record ever wraps).  Layout
// mirrored in spool.py (HEADER_FIELDS); ``spool_layout()`` lets a test compare them.
struct SpoolHeader {
  char magic[8];                      // "CSSPOOL1"
  uint32_t version;                   // 1
  uint32_t header_size;               // sizeof(SpoolHeader)
  uint64_t ring_offset;
  uint64_t ring_size;                 // a power of two
  uint64_t slack;                     // >= kMaxRecord
  uint64_t table_offset;
  uint64_t table_size;
  std::atomic<uint64_t> head;         // position after the last whole record
  std::atomic<uint64_t> tail;         // everything before it is in the store
  std::atomic<uint64_t> table_used;   // bytes of table records
  std::atomic<uint64_t> dropped;      // records that did not fit (running total)
  int64_t pid;
  int64_t created_ns;
  std::atomic<int64_t> forwarded_ns;  // when ``tail`` last moved
  int32_t rank;
  int32_t incarnation;
  std::atomic<uint32_t> flags;        // SPOOL_* below
  uint32_t reserved0;
  // The death, as the process saw it (written by the handlers, read by the forwarder).
  std::atomic<int32_t> sig;           // the fatal signal, 0: none
  int32_t sig_code;                   // si_code
  uint64_t sig_addr;                  // si_addr
  uint64_t sig_tid;                   // pthread id of the thread the signal hit
  int64_t sig_ns;
  std::atomic<int32_t> exit_set;      // 1: the process called os._exit / _exit
  int32_t exit_code;
  int64_t exit_ns;
  std::atomic<int32_t> term_set;      // 1: std::terminate ran
  uint16_t term_type_len;
  uint16_t term_what_len;
  int64_t term_ns;
  uint64_t term_tid;
  char reserved1[56];
  char term_type[256];                // the uncaught C++ exception's type
  char term_what[2048];               // and its what()
  char identity[1536];                // JSON written by spool.py: job, rank, store, ...
};
static_assert(sizeof(SpoolHeader) == 4096, "spool header layout (spool.py HEADER_SIZE)");
static_assert(offsetof(SpoolHeader, head) == 56 && offsetof(SpoolHeader, sig) == 128 &&
                  offsetof(SpoolHeader, term_type) == 256 && offsetof(SpoolHeader, identity) == 2560,
              "spool header layout (spool.py HEADER_FIELDS)");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<int32_t>) == 4, "plain atomics");
constexpr uint32_t SPOOL_CLOSED = 1;  // the owner forwarded everything and left

inline int64_t now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return int64_t(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

inline uint64_t thread_id() { return uint64_t(pthread_self()); }

// ---------------------------------------------------------------- operator specs
enum Dir : int8_t { DIR_NONE = 0, DIR_SEND = 1, DIR_RECV = 2, DIR_RECV_ANY = 3 };

struct OpSpec {
  int32_t opcode = -1;
  int in_arg = -1, out_arg = -1, pg_arg = -1, redop_arg = -1, root_arg = -1, peer_arg = -1, async_arg = -1;
  Dir dir = DIR_NONE;
  bool describe = true;  // barriers carry a dummy tensor: not described
  int max_arg = -1;
  bool returns_work = false;
  void finish() {
    for (int a : {in_arg, out_arg, pg_arg, redop_arg, root_arg, peer_arg, async_arg}) max_arg = a > max_arg ? a : max_arg;
  }
};

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
// enqueue) and work without a future.
struct PendingDevice {
  c10::intrusive_ptr<c10d::Work> work;
  uint64_t id;
  uint8_t role;
  bool device = true;
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
std::atomic<bool> g_active{false};
std::unique_ptr<torch::Library>* g_lib = nullptr;
std::unordered_map<std::string, OpSpec>* g_specs = nullptr;
std::atomic<uint64_t> g_seen{0};

// The wrapped call a thread is inside (logical ops nest: varlen calls torch.distributed).
struct Frame {
  uint64_t id;
  int32_t name;
  int32_t site;
  int64_t ts;
  uint64_t parent;
  uint8_t kind;
  bool async_hint;
  bool child_seen;
  std::vector<uint64_t> children;  // containers: their p2p ops
  std::vector<uint64_t> nested;    // nested traffic: ends at the latest when a synchronous call returns
};
struct Frame;

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

void write_text_record(uint8_t type, uint8_t flags, int64_t ts, uint64_t id, const char* text, size_t n) {
  if (n > kMaxText) n = kMaxText;
  size_t len = sizeof(Header) + 2 + n;
  uint8_t* p = reserve(len);
  if (!p) return;
  put_header(p, type, flags, uint32_t(len), ts, id);
  uint16_t n16 = uint16_t(n);
  std::memcpy(p + sizeof(Header), &n16, 2);
  if (n) std::memcpy(p + sizeof(Header) + 2, text, n);
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

// A GROUP record: the name (and, once Python has told them, backend and global ranks).
void put_group_locked(int32_t gid, const std::string& name, const std::string& backend,
                      const std::vector<int32_t>* granks) {
  std::string body;
  const std::string shown = name + S->group_suffix;
  put_u16_text(body, shown.data(), shown.size());
  put_u16_text(body, backend.data(), backend.size());
  int32_t n = granks == nullptr ? -1 : int32_t(granks->size());
  body.append(reinterpret_cast<const char*>(&n), 4);
  if (granks != nullptr && n > 0) body.append(reinterpret_cast<const char*>(granks->data()), 4 * size_t(n));
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

// ---------------------------------------------------------------- tensor descriptions
// A side's tensors, encoded as they are read: per tensor u8 dtype, u8 ndim, i64 dims[ndim],
// into a buffer the thread reuses (no allocation per call once warm).
struct Side {
  ByteBuf* enc;
  uint32_t count = 0;     // tensors passed
  uint16_t described = 0; // tensors encoded (capped)
  int64_t bytes = 0;
  int8_t device = -1;
  void add(const at::Tensor& t) {
    count++;
    if (!t.defined()) return;
    bytes += int64_t(t.nbytes());
    if (device < 0 && t.is_cuda()) device = int8_t(t.device().index());
    auto s = t.sizes();
    size_t nd = s.size() > 255 ? 255 : s.size();
    if (described >= kMaxTensorsDescribed || enc->size() + 2 + 8 * nd > kMaxDescribedBytes) return;
    described++;
    uint8_t* p = enc->grow(2 + 8 * nd);
    if (p == nullptr) {
      described--;
      return;
    }
    p[0] = uint8_t(int8_t(t.scalar_type()));
    p[1] = uint8_t(nd);
    std::memcpy(p + 2, s.data(), 8 * nd);
  }
  void add_value(const c10::IValue& v) {
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList() || v.isList()) {  // Tensor[] or Tensor[][]: no refcount traffic
      for (const c10::IValue& inner : v.toListRef()) add_value(inner);
    }
  }
};

// Everything a thread keeps for itself, in one block reached through one plain pointer:
// each C++ thread_local of a dlopen'ed module costs a __tls_get_addr call per use (and a
// guard check for those with constructors), dozens per op.
struct Tls {
  std::vector<Frame> frames;  // the wrapped calls this thread is inside
  int native_depth = 0;       // >0 while inside our kernel (nested dispatches)
  uint64_t native_id = 0;
  ByteBuf enc_in, enc_out;    // tensor descriptions of the op being observed
  ByteBuf key, last_key;      // this begin's signature key, and the thread's last one (a loop repeats it)
  std::string sig_key;        // the key as the signature table's key (made only on a change)
  uint32_t last_sid = 0;
  const void* last_schema = nullptr;  // spec_of's cache
  const OpSpec* last_spec = nullptr;
  PyObject* internal_code = nullptr;  // code_internal's cache (held by g_code_internal)
  int internal_value = 0;
  PyObject* site_code = nullptr;  // site_id's cache
  int site_lasti = -1;
  int32_t site_sid = -1;
};
thread_local Tls* t_tls = nullptr;  // trivially initialised: no guard
pthread_key_t g_tls_key;

void tls_free(void* p) {
  t_tls = nullptr;
  delete static_cast<Tls*>(p);
}

inline Tls& tls() {
  Tls* t = t_tls;
  if (__builtin_expect(t == nullptr, 0)) {
    t = new Tls();
    t_tls = t;
    pthread_setspecific(g_tls_key, t);  // freed when the thread exits
  }
  return *t;
}
constexpr uint32_t kNoSig = 0xFFFFFFFFu;
constexpr size_t kMaxSigs = 100000;

// ---------------------------------------------------------------- completion
void complete_locked(uint64_t id, uint8_t role, bool error, const std::string& msg, bool approx) {
  // Ops that end at completion: issued from C++, annotated, nested.  A merged op ends
  // when the Python call returns; its completion is only noted for device ops (DONE).
  if (role == ROLE_NESTED && S->open_nested.erase(id) == 0) return;  // closed when its call returned
  int64_t ts = now_ns();
  uint8_t flags = (error ? FLAG_ERROR : 0) | (approx ? FLAG_APPROX : 0);
  if (error) S->last_failed_ns = ts;
  if (error)
    write_text_record(REC_END, flags, ts, id, msg.data(), msg.size());
  else
    write_text_record(REC_END, flags, ts, id, nullptr, 0);
  if (role != ROLE_NESTED) S->inflight.erase(id);
}

void on_completed(uint64_t id, uint8_t role, bool error, const std::string& msg, bool approx) {
  Recording g;
  complete_locked(id, role, error, msg, approx);
}

void resolve_source(uint64_t id, int32_t gid, int32_t src, bool ends_here, uint8_t role, bool error,
                    const std::string& msg) {
  Recording g;
  if (!error && src >= 0) {
    int64_t seq = -1;
    if (role != ROLE_NESTED)
      seq = ++S->p2p_seq[std::make_tuple(gid, src, int8_t(DIR_RECV))];
    if (role == ROLE_MERGED) {
      S->resolved_source[id] = {src, seq};  // the Python call's END carries it
    } else {
      size_t len = sizeof(Header) + sizeof(SourceBody);
      if (uint8_t* p = reserve(len)) {
        put_header(p, REC_SOURCE, 0, uint32_t(len), now_ns(), id);
        SourceBody b{src, seq};
        std::memcpy(p + sizeof(Header), &b, sizeof b);
      }
    }
  }
  if (ends_here) complete_locked(id, role, error, msg, false);
}

// ---------------------------------------------------------------- the kernel
// The object behind a custom-class argument, without touching reference counts (the
// refcount traffic of toCustomClass() costs more than the rest of the observation).
// The operator's schema guarantees the argument's class.
template <class T>
const T* custom_ptr(const c10::IValue& v) {
  if (!v.isObject()) return nullptr;
  const auto& slots = v.toObjectRef().slots();
  if (slots.size() != 1 || !slots[0].isCapsule()) return nullptr;
  return static_cast<const T*>(static_cast<const torch::CustomClassHolder*>(slots[0].internalToPointer()));
}

const OpSpec* spec_of(Tls& T, const c10::OperatorHandle& op) {
  // One lookup per operator per thread: the schema object outlives the registration.
  const void* key = &op.schema();
  if (key == T.last_schema) return T.last_spec;
  auto it = g_specs->find(op.schema().name());
  const OpSpec* spec = it == g_specs->end() ? nullptr : &it->second;
  T.last_schema = key;
  T.last_spec = spec;
  return spec;
}

void observe(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto next = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);
  if (!g_active.load(std::memory_order_relaxed)) {
    op.redispatchBoxed(next, stack);
    return;
  }
  Tls& T = tls();
  const OpSpec* spec = spec_of(T, op);
  const size_t nargs = op.schema().arguments().size();
  if (spec == nullptr || stack->size() < nargs || spec->max_arg >= int(nargs)) {
    op.redispatchBoxed(next, stack);
    return;
  }
  g_seen.fetch_add(1, std::memory_order_relaxed);
  const c10::IValue* args = stack->data() + (stack->size() - nargs);

  // What moves, on which group (no lock needed: only this call's arguments).
  T.enc_in.clear();
  T.enc_out.clear();
  Side in{&T.enc_in}, out{&T.enc_out};
  const c10d::ProcessGroup* pg = nullptr;
  int32_t root = -1, peer = -1;
  int16_t redop = -1;
  bool async_op = false;
  try {
    if (spec->describe) {
      if (spec->in_arg >= 0) in.add_value(args[spec->in_arg]);
      if (spec->out_arg >= 0 && spec->out_arg != spec->in_arg) out.add_value(args[spec->out_arg]);
    }
    if (spec->pg_arg >= 0) pg = custom_ptr<c10d::ProcessGroup>(args[spec->pg_arg]);
    if (spec->root_arg >= 0 && args[spec->root_arg].isInt()) root = int32_t(args[spec->root_arg].toInt());
    if (spec->peer_arg >= 0 && args[spec->peer_arg].isInt()) peer = int32_t(args[spec->peer_arg].toInt());
    if (spec->redop_arg >= 0) {
      const c10d::ReduceOp* r = custom_ptr<c10d::ReduceOp>(args[spec->redop_arg]);
      if (r != nullptr) redop = int16_t(r->op_);
    }
    if (spec->async_arg >= 0 && args[spec->async_arg].isBool()) async_op = args[spec->async_arg].toBool();
  } catch (...) {
    pg = nullptr;
  }
  if (pg == nullptr) {  // not an op we understand: torch decides
    op.redispatchBoxed(next, stack);
    return;
  }
  const int8_t device = in.device >= 0 ? in.device : out.device;

  // Who issued it.
  Frame* frame = T.frames.empty() ? nullptr : &T.frames.back();
  uint8_t role = ROLE_TOP;
  uint64_t parent = 0;
  if (T.native_depth > 0) {
    role = ROLE_NESTED;
    parent = T.native_id;
  } else if (frame != nullptr) {
    parent = frame->id;
    if (frame->kind == KIND_CONTAINER)
      role = ROLE_CHILD;
    else if (frame->kind == KIND_ANNOTATE)
      role = ROLE_ANNOTATED;  // every collective inside: its own op, with the frame's call site
    else if (frame->kind == KIND_RICH || frame->child_seen)
      role = ROLE_NESTED;
    else
      role = ROLE_MERGED;
  }
  const bool ends_at_completion = role == ROLE_TOP || role == ROLE_ANNOTATED || role == ROLE_NESTED;
  const bool merged = role == ROLE_MERGED;
  const bool framed = role == ROLE_MERGED || role == ROLE_ANNOTATED;  // name/site from the wrapped call
  const uint64_t rec_parent = framed ? frame->parent : parent;
  uint64_t id;
  int32_t gid;
  {
    Recording g;
    gid = group_id_locked(pg);
    int64_t seq = -1;
    if (merged) {
      id = frame->id;  // the wrapped call and its collective are one op
    } else {
      id = S->next_id.fetch_add(1, std::memory_order_relaxed);
    }
    if (framed) frame->child_seen = true;
    if (role != ROLE_NESTED) seq = next_seq_locked(gid, spec->dir, peer);
    if (role == ROLE_CHILD) frame->children.push_back(id);
    if (role == ROLE_NESTED && ends_at_completion) {
      S->open_nested.insert(id);
      if (frame != nullptr && T.native_depth == 0) frame->nested.push_back(id);
    }
    int64_t ts = merged ? frame->ts : now_ns();
    uint8_t flags = ((async_op || (frame && frame->async_hint && role == ROLE_MERGED)) ? FLAG_ASYNC : 0) |
                    (ends_at_completion ? FLAG_ENDS_AT_COMPLETION : 0);
    // What repeats call after call (everything but ts, id, seq, parent, thread) is a
    // signature, written once as a SIG record; each begin then only refers to it.
    BeginBody b{};
    b.name = merged ? frame->name : -1;
    b.site = (framed || role == ROLE_CHILD) ? frame->site : -1;
    b.opcode = spec->opcode;
    b.gid = gid;
    b.seq = -1;
    b.peer = peer;
    b.root = root;
    b.redop = redop;
    b.role = role;
    b.device = device;
    b.nin = in.described;
    b.nout = out.described;
    b.ntensors_in = in.count;
    b.ntensors_out = out.count;
    b.bytes_in = in.bytes;
    b.bytes_out = out.bytes;
    // The key: flags, direction, the body, the tensor descriptions; built with inline
    // copies, and a std::string made of it only when it differs from the thread's last.
    const size_t key_len = 2 + sizeof b + T.enc_in.size() + T.enc_out.size();
    T.key.clear();
    uint8_t* kp = T.key.grow(key_len);
    bool repeat = false;
    if (kp != nullptr) {
      kp[0] = flags;
      kp[1] = uint8_t(spec->dir);
      std::memcpy(kp + 2, &b, sizeof b);
      if (!T.enc_in.empty()) std::memcpy(kp + 2 + sizeof b, T.enc_in.data(), T.enc_in.size());
      if (!T.enc_out.empty()) std::memcpy(kp + 2 + sizeof b + T.enc_in.size(), T.enc_out.data(), T.enc_out.size());
      repeat = T.last_key.size() == key_len && std::memcmp(T.last_key.data(), kp, key_len) == 0;
    }
    std::string& key = T.sig_key;
    uint32_t sid = kNoSig;
    bool fresh = false;
    if (kp == nullptr) {  // out of memory: a self-contained begin
    } else if (repeat) {  // signatures are never forgotten: the id stays valid
      sid = T.last_sid;
    } else {
      key.assign(reinterpret_cast<const char*>(kp), key_len);
      auto sit = S->sigs.find(key);
      if (sit != S->sigs.end())
        sid = sit->second;
      else if (S->sigs.size() < kMaxSigs)
        sid = uint32_t(S->sigs.size()), fresh = true;
    }
    if (sid != kNoSig) {
      if (fresh) {  // a new signature: a table record, restated by every block that uses it
        std::string rec(sizeof(Header) + key_len - 2, '\0');
        Header h{REC_SIG, flags, uint16_t(spec->dir), uint32_t(rec.size()), 0, sid};
        std::memcpy(&rec[0], &h, sizeof h);
        std::memcpy(&rec[sizeof h], kp + 2, key_len - 2);
        table_put(S->sig_recs, &S->sig_mark, sid, std::move(rec));
        S->sigs.emplace(key, sid);
      }
      if (!repeat) {
        T.last_key.swap(T.key);  // the key becomes the last one; the old buffer is reused next time
        T.last_sid = sid;
      }
      const size_t len = sizeof(Header) + sizeof(SigBeginBody);
      uint8_t* p = reserve(len);
      if (p) {
        put_header(p, REC_BEGIN_SIG, 0, uint32_t(len), ts, id);
        SigBeginBody sb{sid, seq, rec_parent, thread_id()};
        std::memcpy(p + sizeof(Header), &sb, sizeof sb);
      }
    } else {  // the signature table is full: self-contained begins
      size_t len = sizeof(Header) + sizeof(BeginBody) + T.enc_in.size() + T.enc_out.size();
      uint8_t* p = reserve(len);
      if (p) {
        put_header(p, REC_BEGIN, flags, uint32_t(len), ts, id, uint16_t(spec->dir));
        b.tid = thread_id();
        b.parent = rec_parent;
        b.seq = seq;
        std::memcpy(p + sizeof(Header), &b, sizeof b);
        uint8_t* q = p + sizeof(Header) + sizeof b;
        if (!T.enc_in.empty()) std::memcpy(q, T.enc_in.data(), T.enc_in.size());
        if (!T.enc_out.empty()) std::memcpy(q + T.enc_in.size(), T.enc_out.data(), T.enc_out.size());
      }
    }
    if (role != ROLE_NESTED && role != ROLE_CHILD)
      S->inflight.put(id, Inflight{ts, thread_id(), rec_parent, false, false});
  }

  const uint64_t outer_id = T.native_id;
  T.native_depth++;
  T.native_id = id;
  try {
    op.redispatchBoxed(next, stack);
  } catch (const std::exception& e) {
    T.native_depth--;
    T.native_id = outer_id;
    if (ends_at_completion) on_completed(id, role, true, e.what(), false);
    throw;
  } catch (...) {
    T.native_depth--;
    T.native_id = outer_id;
    if (ends_at_completion) on_completed(id, role, true, "unknown error", false);
    throw;
  }
  T.native_depth--;
  T.native_id = outer_id;

  // Completion.
  const bool any_source = spec->dir == DIR_RECV_ANY;
  if (!ends_at_completion && !any_source && device < 0) return;  // the Python call's END is the end
  c10::intrusive_ptr<c10d::Work> work;  // the last return value, when the op returns one
  if (!stack->empty() && stack->back().isObject() && spec->returns_work) {
    try {
      work = stack->back().toCustomClass<c10d::Work>();
    } catch (...) {
    }
  }
  if (!work) {  // a synchronous op (monitored_barrier): it completed here
    if (ends_at_completion) on_completed(id, role, false, std::string(), false);
    return;
  }
  if (device >= 0) {  // CUDA: the future completes at enqueue; poll the work instead
    Recording g;
    if (S->device_pending.size() < 65536) S->device_pending.push_back(PendingDevice{work, id, role, true});
    return;
  }
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    fut = work->getFuture();
  } catch (...) {
  }
  if (!fut) {  // no future (Gloo's send/recv work): the thread polls the work instead
    Recording g;
    if (S->device_pending.size() < 65536)
      S->device_pending.push_back(PendingDevice{work, id, role, false});
    else if (ends_at_completion)
      complete_locked(id, role, false, std::string(), true);
    return;
  }
  c10::weak_intrusive_ptr<c10d::Work> weak(work);
  try {
    fut->addCallback([id, role, gid, any_source, ends_at_completion, weak](c10::ivalue::Future& f) {
      bool error = f.hasError();
      std::string msg = error ? f.tryRetrieveErrorMessage() : std::string();
      if (any_source) {
        int32_t src = -1;
        if (!error) {
          auto w = weak.lock();
          if (w) {
            try {
              src = w->sourceRank();
            } catch (...) {
            }
          }
        }
        resolve_source(id, gid, src, ends_at_completion, role, error, msg);
      } else {
        on_completed(id, role, error, msg, false);
      }
    });
  } catch (...) {
    if (ends_at_completion) on_completed(id, role, false, std::string(), true);
  }
}


// ================================================================ Python side (GIL held)
PyObject* g_is_internal = nullptr;  // callable(code) -> bool: torch's or commscope's own frame
PyObject* g_work_type = nullptr;    // torch.distributed.Work
PyObject* g_after_op = nullptr;     // called once after the next wrapped call returns (job id settling)
std::unordered_map<PyObject*, int8_t>* g_code_internal = nullptr;  // code -> internal? (holds a ref)
std::map<std::pair<PyObject*, int>, int32_t>* g_sites = nullptr;   // (code, lasti) -> site id (holds a ref)
PyObject* g_site_text = nullptr;    // callable(code, lasti) -> "file:line in function"
constexpr size_t kMaxCodes = 50000, kMaxSites = 100000;

// The op ids a Work (or varlen handle) stands for: nearly always one, kept inline (no
// allocation per async op).
struct OpIds {
  uint64_t one = 0;
  std::vector<uint64_t> many;  // all of them, once there is more than one
  uint32_t n = 0;
  OpIds() = default;
  explicit OpIds(uint64_t id) : one(id), n(1) {}
  void push_back(uint64_t id) {
    if (n == 0) {
      one = id;
    } else {
      if (n == 1) many.push_back(one);
      many.push_back(id);
    }
    n++;
  }
  const uint64_t* begin() const { return n <= 1 ? &one : many.data(); }
  const uint64_t* end() const { return begin() + n; }
  bool empty() const { return n == 0; }
  uint64_t operator[](size_t i) const { return begin()[i]; }
};

struct Tracked {
  PyObject* ref;  // weakref to the Work (or varlen handle)
  OpIds ids;
};
std::unordered_map<PyObject*, Tracked>* g_tracked = nullptr;
std::vector<uint64_t>* g_unwaited_lost = nullptr;  // collected without a wait (the first ones)
uint64_t g_unwaited_count = 0;                      // all ops collected without a wait
constexpr size_t kMaxTracked = 4096, kMaxUnwaitedLost = 1000;

// Tracked work collected without a wait: counted (every one) and listed (the first ones).
void sweep_tracked() {
  for (auto it = g_tracked->begin(); it != g_tracked->end();) {
    if (PyWeakref_GetObject(it->second.ref) == Py_None) {
      for (uint64_t id : it->second.ids) {
        g_unwaited_count++;
        if (g_unwaited_lost->size() < kMaxUnwaitedLost) g_unwaited_lost->push_back(id);
      }
      Py_DECREF(it->second.ref);
      it = g_tracked->erase(it);
    } else {
      ++it;
    }
  }
}

int frame_lasti(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return f->f_lasti * int(sizeof(_Py_CODEUNIT));
#endif
}

int code_internal(Tls& T, PyObject* code) {
  if (code == T.internal_code) return T.internal_value;  // held by g_code_internal once cached
  auto it = g_code_internal->find(code);
  if (it != g_code_internal->end()) {
    T.internal_code = code;
    T.internal_value = it->second;
    return T.internal_value;
  }
  int internal = 0;
  if (g_is_internal != nullptr) {
    PyObject* r = PyObject_CallOneArg(g_is_internal, code);
    if (r == nullptr) {
      PyErr_Clear();
    } else {
      internal = PyObject_IsTrue(r) == 1;
      Py_DECREF(r);
    }
  }
  if (g_code_internal->size() < kMaxCodes) {
    Py_INCREF(code);
    g_code_internal->emplace(code, int8_t(internal));
  }
  return internal;
}

// A new call site's text, asked of Python once (the GIL is held) and kept as a table
// record, so the spool can say where an op was called from even if the rank dies
// before its next tick.
void note_site(int32_t sid, PyObject* code, int lasti) {
  std::string body;
  if (g_site_text != nullptr) {
    PyObject* r = PyObject_CallFunction(g_site_text, "Oi", code, lasti);
    if (r == nullptr) {
      PyErr_Clear();
    } else {
      Py_ssize_t n = 0;
      const char* c = PyUnicode_Check(r) ? PyUnicode_AsUTF8AndSize(r, &n) : nullptr;
      if (c == nullptr) PyErr_Clear();
      else put_u16_text(body, c, size_t(n) > kMaxText ? kMaxText : size_t(n));
      Py_DECREF(r);
    }
  }
  if (body.empty()) put_u16_text(body, "", 0);
  Recording g;
  table_put(S->site_recs, &S->site_mark, size_t(sid), table_record(REC_SITE, uint64_t(sid), body));
}

int32_t site_id(Tls& T, PyObject* code, int lasti) {
  // A training loop calls from the same place again and again: remember the last one.
  if (code == T.site_code && lasti == T.site_lasti) return T.site_sid;
  auto key = std::make_pair(code, lasti);
  auto it = g_sites->find(key);
  int32_t sid;
  if (it != g_sites->end()) {
    sid = it->second;
  } else {
    if (g_sites->size() >= kMaxSites) return -1;
    sid = int32_t(g_sites->size());
    Py_INCREF(code);  // held by g_sites: the pointer stays this code object's
    g_sites->emplace(key, sid);
    note_site(sid, code, lasti);
  }
  T.site_code = code;
  T.site_lasti = lasti;
  T.site_sid = sid;
  return sid;
}

// The first frame outside torch and commscope, as a site id.
int32_t current_site(Tls& T) {
#ifdef COMMSCOPE_INTERPRETER_FRAMES
  // What PyEval_GetFrame/PyFrame_GetBack walk, without making frame objects.
  PyThreadState* ts = PyThreadState_Get();
  int depth = 0;
  for (_PyInterpreterFrame* f = ts->cframe->current_frame; f != nullptr && depth < 128; f = f->previous) {
    if (_PyFrame_IsIncomplete(f)) continue;
    depth++;
    PyObject* code = (PyObject*)f->f_code;  // held by the frame, which outlives this call
    if (!code_internal(T, code)) {
      int lasti = _PyInterpreterFrame_LASTI(f);
      return site_id(T, code, lasti < 0 ? -1 : lasti * int(sizeof(_Py_CODEUNIT)));  // as PyFrame_GetLasti
    }
  }
  return -1;
#else
  PyFrameObject* f = PyEval_GetFrame();  // borrowed: the caller of the wrapper
  if (f == nullptr) return -1;
  Py_INCREF(f);
  for (int depth = 0; f != nullptr && depth < 128; depth++) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    if (!code_internal(T, (PyObject*)code)) {
      int32_t sid = site_id(T, (PyObject*)code, frame_lasti(f));
      Py_DECREF(code);
      Py_DECREF(f);
      return sid;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return -1;
#endif
}

// "Type: message" of the exception being raised, leaving it raised.
std::string exception_text() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  std::string text;
  if (type != nullptr) {
    const char* name = ((PyTypeObject*)type)->tp_name;
    const char* dot = strrchr(name, '.');
    text = dot ? dot + 1 : name;
    if (value != nullptr) {
      PyObject* s = PyObject_Str(value);
      if (s != nullptr) {
        Py_ssize_t n = 0;
        const char* c = PyUnicode_AsUTF8AndSize(s, &n);
        if (c != nullptr && n > 0) {
          text += ": ";
          text.append(c, size_t(n) > kMaxText ? kMaxText : size_t(n));
        }
        Py_DECREF(s);
      }
      PyErr_Clear();
    }
  }
  PyErr_Restore(type, value, tb);
  return text;
}

void write_logical_begin_locked(const Frame& fr, uint8_t role) {
  size_t len = sizeof(Header) + sizeof(BeginBody);
  uint8_t* p = reserve(len);
  if (!p) return;
  put_header(p, REC_BEGIN, 0, uint32_t(len), fr.ts, fr.id);
  BeginBody b{};
  b.tid = thread_id();
  b.parent = fr.parent;
  b.name = fr.name;
  b.site = fr.site;
  b.opcode = -1;
  b.gid = -1;
  b.seq = -1;
  b.peer = b.root = -1;
  b.redop = -1;
  b.role = role;
  b.device = -1;
  std::memcpy(p + sizeof(Header), &b, sizeof b);
}

// The wrapped call returned (or raised): its END, and its children's for a container.
void record_exit(Frame& fr, bool error, const char* text, size_t text_len) {
  Recording g;
  int64_t ts = now_ns();
  uint8_t flags = error ? FLAG_ERROR : 0;
  if (error) S->last_failed_ns = ts;
  if (fr.kind == KIND_CONTAINER) {
    for (uint64_t child : fr.children) write_text_record(REC_END, flags, ts, child, text, error ? text_len : 0);
  }
  if (!fr.async_hint) {  // a call that returned is done with its traffic
    for (uint64_t child : fr.nested)
      if (S->open_nested.erase(child)) write_text_record(REC_END, 0, ts, child, nullptr, 0);
  }
  if (!fr.child_seen && (fr.kind == KIND_PLAIN || fr.kind == KIND_ANNOTATE)) {
    if (!error) return;  // nothing dispatched, nothing failed: e.g. a group this rank is not in
    write_logical_begin_locked(fr, ROLE_LOGICAL);
  } else if (fr.kind == KIND_ANNOTATE) {
    return;  // not an op itself: its collectives end (or fail) when they complete
  }
  auto src = S->resolved_source.empty() ? S->resolved_source.end() : S->resolved_source.find(fr.id);
  if (src != S->resolved_source.end()) {
    size_t len = sizeof(Header) + sizeof(SourceBody);
    if (uint8_t* p = reserve(len)) {
      put_header(p, REC_SOURCE, 0, uint32_t(len), ts, fr.id);
      SourceBody b{src->second.first, src->second.second};
      std::memcpy(p + sizeof(Header), &b, sizeof b);
    }
    S->resolved_source.erase(src);
  }
  write_text_record(REC_END, flags, ts, fr.id, text, error ? text_len : 0);
  S->inflight.erase(fr.id);
}

void track_work(PyObject* work, OpIds ids) {
  if (g_tracked->size() >= kMaxTracked) {  // forget collected ones: they were never waited on
    sweep_tracked();
    if (g_tracked->size() >= kMaxTracked) return;
  }
  PyObject* ref = PyWeakref_NewRef(work, nullptr);
  if (ref == nullptr) {
    PyErr_Clear();
    return;
  }
  auto it = g_tracked->find(work);
  if (it != g_tracked->end()) {
    Py_DECREF(it->second.ref);
    g_tracked->erase(it);
  }
  g_tracked->emplace(work, Tracked{ref, std::move(ids)});
}

// ---------------------------------------------------------------- Wrapper: a recorded callable
struct WrapperObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* orig;
  PyObject* dict;
  PyObject* weakrefs;
  int32_t name;
  uint8_t kind;
  bool async_hint;
};

PyObject* wrapper_vectorcall(PyObject* self_, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = (WrapperObject*)self_;
  // Inside another recorded call (a varlen op calling torch.distributed), this call's
  // collectives are that call's nested traffic: no frame of its own.  Only a call that
  // merely lends its call site (ANNOTATE: torch's internal entry points) lets a wrapped
  // torch.distributed call inside it be an op of its own.
  if (!g_active.load(std::memory_order_relaxed)) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
  Tls& T = tls();
  auto& frames = T.frames;
  if (!frames.empty() && (frames.back().kind != KIND_ANNOTATE || self->kind == KIND_ANNOTATE))
    return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
  const int32_t site = current_site(T);
  const uint64_t parent = frames.empty() ? 0 : frames.back().id;
  {
    Frame& fr = frames.emplace_back();  // built in place: no Frame (two vectors) moved in and out
    fr.id = S->next_id.fetch_add(1, std::memory_order_relaxed);
    fr.name = self->name;
    fr.site = site;
    fr.ts = now_ns();
    fr.parent = parent;
    fr.kind = self->kind;
    fr.async_hint = self->async_hint;
    fr.child_seen = false;
  }
  PyObject* ret = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
  // Calls inside have pushed and popped theirs: ours is the innermost again (the vector
  // may have moved, so it is looked up, not kept).
  Frame& done = frames.back();
  if (ret == nullptr) {
    std::string text = exception_text();
    record_exit(done, true, text.data(), text.size());
    frames.pop_back();
    return nullptr;
  }
  record_exit(done, false, nullptr, 0);
  const uint64_t done_id = done.id;
  const bool child_seen = done.child_seen;
  frames.pop_back();
  if (g_after_op != nullptr && child_seen) {
    PyObject* cb = g_after_op;
    g_after_op = nullptr;
    PyObject* r = PyObject_CallNoArgs(cb);
    if (r == nullptr) PyErr_Clear();
    Py_XDECREF(r);
    Py_DECREF(cb);
  }
  if (child_seen && g_work_type != nullptr && PyObject_TypeCheck(ret, (PyTypeObject*)g_work_type))
    track_work(ret, OpIds(done_id));
  return ret;
}

PyObject* wrapper_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* orig;
  int name, kind, async_hint = 0;
  static const char* kw[] = {"orig", "name", "kind", "async_hint", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oii|p", (char**)kw, &orig, &name, &kind, &async_hint))
    return nullptr;
  auto* self = (WrapperObject*)type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  self->vectorcall = wrapper_vectorcall;
  Py_INCREF(orig);
  self->orig = orig;
  self->dict = nullptr;
  self->weakrefs = nullptr;
  self->name = name;
  self->kind = uint8_t(kind);
  self->async_hint = async_hint != 0;
  return (PyObject*)self;
}

int wrapper_traverse(PyObject* self_, visitproc visit, void* arg) {
  auto* self = (WrapperObject*)self_;
  Py_VISIT(self->orig);
  Py_VISIT(self->dict);
  return 0;
}

int wrapper_clear(PyObject* self_) {
  auto* self = (WrapperObject*)self_;
  Py_CLEAR(self->orig);
  Py_CLEAR(self->dict);
  return 0;
}

void wrapper_dealloc(PyObject* self_) {
  auto* self = (WrapperObject*)self_;
  PyObject_GC_UnTrack(self_);
  if (self->weakrefs != nullptr) PyObject_ClearWeakRefs(self_);
  wrapper_clear(self_);
  Py_TYPE(self_)->tp_free(self_);
}

PyObject* wrapper_orig(PyObject* self_, void*) {
  PyObject* o = ((WrapperObject*)self_)->orig;
  Py_INCREF(o);
  return o;
}

PyGetSetDef wrapper_getset[] = {
    {"__commscope_orig__", wrapper_orig, nullptr, nullptr, nullptr},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject WrapperType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------- WaitWrapper: Work.wait, recorded
struct WaitObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* orig;
  // What calling orig calls: pybind11 makes Work.wait an instancemethod around a builtin,
  // which calling it would reach through a tuple and PyObject_Call; the builtin is called
  // with the same arguments directly (what instancemethod_call does).
  PyObject* call;
};

PyObject* wait_vectorcall(PyObject* self_, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = (WaitObject*)self_;
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (!g_active.load(std::memory_order_relaxed) || n < 1 || g_tracked->empty())
    return PyObject_Vectorcall(self->call, args, nargsf, kwnames);
  auto it = g_tracked->find(args[0]);
  if (it == g_tracked->end() || PyWeakref_GetObject(it->second.ref) != args[0])
    return PyObject_Vectorcall(self->call, args, nargsf, kwnames);
  OpIds ids = std::move(it->second.ids);
  Py_DECREF(it->second.ref);
  g_tracked->erase(it);
  const uint64_t tid = thread_id();
  {
    Recording g;
    int64_t ts = now_ns();
    for (uint64_t id : ids) {
      size_t len = sizeof(Header) + 8;
      if (uint8_t* p = reserve(len)) {
        put_header(p, REC_WAIT_BEGIN, 0, uint32_t(len), ts, id);
        std::memcpy(p + sizeof(Header), &tid, 8);
      }
    }
    if (!ids.empty()) S->inflight.put(ids[0], Inflight{ts, tid, 0, true, false});
  }
  PyObject* ret = PyObject_Vectorcall(self->call, args, nargsf, kwnames);
  std::string text = ret == nullptr ? exception_text() : std::string();
  {
    Recording g;
    int64_t ts = now_ns();
    if (ret == nullptr) S->last_failed_ns = ts;
    for (uint64_t id : ids)
      write_text_record(REC_WAIT_END, ret == nullptr ? FLAG_ERROR : 0, ts, id, text.data(), text.size());
    if (!ids.empty()) S->inflight.erase(ids[0]);
  }
  return ret;
}

PyObject* wait_new(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject* orig;
  if (!PyArg_ParseTuple(args, "O", &orig)) return nullptr;
  auto* self = (WaitObject*)type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  self->vectorcall = wait_vectorcall;
  Py_INCREF(orig);
  self->orig = orig;
  self->call = PyInstanceMethod_Check(orig) ? PyInstanceMethod_GET_FUNCTION(orig) : orig;
  Py_INCREF(self->call);
  return (PyObject*)self;
}

void wait_dealloc(PyObject* self_) {
  Py_XDECREF(((WaitObject*)self_)->orig);
  Py_XDECREF(((WaitObject*)self_)->call);
  Py_TYPE(self_)->tp_free(self_);
}

PyObject* wait_get(PyObject* self, PyObject* obj, PyObject*) {  // a method: bind like a function
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

PyObject* wait_orig(PyObject* self_, void*) {
  PyObject* o = ((WaitObject*)self_)->orig;
  Py_INCREF(o);
  return o;
}

PyGetSetDef wait_getset[] = {
    {"__commscope_orig__", wait_orig, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject WaitType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------- module functions
int arg_index(const c10::FunctionSchema& schema, std::initializer_list<const char*> names) {
  const auto& args = schema.arguments();
  for (const char* want : names)
    for (size_t i = 0; i < args.size(); i++)
      if (args[i].name() == want) return int(i);
  return -1;
}

// install(ops, is_internal, work_type, site_text): ops is a list of c10d operator names to
// observe, in opcode order; site_text(code, lasti) formats a new call site.  Returns the
// names actually registered.
PyObject* py_install(PyObject*, PyObject* args) {
  PyObject *ops, *is_internal, *work_type, *site_text;
  if (!PyArg_ParseTuple(args, "OOOO", &ops, &is_internal, &work_type, &site_text)) return nullptr;
  Py_XDECREF(g_site_text);
  Py_INCREF(site_text);
  g_site_text = site_text;
  PyObject* seq = PySequence_Fast(ops, "ops must be a sequence");
  if (seq == nullptr) return nullptr;
  Py_XDECREF(g_is_internal);
  Py_INCREF(is_internal);
  g_is_internal = is_internal;
  Py_XDECREF(g_work_type);
  Py_INCREF(work_type);
  g_work_type = work_type;
  PyObject* done = PyList_New(0);
  try {
    g_lib->reset();  // specs stay: a thread's cached spec pointer must never dangle
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d", c10::DispatchKey::BackendSelect,
                                                __FILE__, __LINE__);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
      // (operator, direction, describe): the traits come from commscope/optable.py's C10D rows
      const char* name = nullptr;
      int dir = DIR_NONE, describe = 1;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sip", &name, &dir, &describe) ||
          dir < DIR_NONE || dir > DIR_RECV_ANY) {
        PyErr_Clear();
        continue;
      }
      auto handle = c10::Dispatcher::singleton().findSchema({std::string("c10d::") + name, ""});
      if (!handle) continue;  // not in this torch
      const auto& schema = handle->schema();
      OpSpec spec;
      spec.opcode = int32_t(i);
      spec.dir = Dir(dir);
      spec.describe = describe != 0;
      spec.pg_arg = arg_index(schema, {"process_group"});
      spec.redop_arg = arg_index(schema, {"reduce_op"});
      spec.root_arg = arg_index(schema, {"root_rank"});
      spec.async_arg = arg_index(schema, {"async_op"});
      if (spec.dir == DIR_SEND)
        spec.peer_arg = arg_index(schema, {"dst", "dstRank"});
      else if (spec.dir == DIR_RECV)
        spec.peer_arg = arg_index(schema, {"src", "srcRank"});
      int both = arg_index(schema, {"tensors", "tensor"});
      if (both >= 0) {
        if (spec.dir == DIR_RECV || spec.dir == DIR_RECV_ANY)
          spec.out_arg = both;
        else if (spec.dir == DIR_SEND)
          spec.in_arg = both;
        else
          spec.in_arg = spec.out_arg = both;
      } else {
        spec.in_arg = arg_index(schema, {"input_tensors", "input_tensor", "inputs", "input_list", "input"});
        spec.out_arg = arg_index(schema, {"output_tensors", "output_tensor", "outputs", "output_lists", "output"});
      }
      if (spec.pg_arg < 0) continue;
      spec.finish();
      const auto& rets = schema.returns();
      spec.returns_work = !rets.empty() && rets.back().type()->str().find("Work") != std::string::npos;
      (*g_specs)[schema.name()] = spec;  // assigned in place: its address is stable
      lib->impl(name, torch::CppFunction::makeFromBoxedFunction<&observe>());
      PyObject* s = PyUnicode_FromString(name);
      PyList_Append(done, s);
      Py_DECREF(s);
    }
    *g_lib = std::move(lib);
  } catch (const std::exception& e) {
    Py_DECREF(seq);
    Py_DECREF(done);
    g_lib->reset();
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_DECREF(seq);
  g_active.store(true);
  return done;
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  g_active.store(false);
  try {
    g_lib->reset();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* py_set_after_op(PyObject*, PyObject* arg) {
  Py_XDECREF(g_after_op);
  g_after_op = nullptr;
  if (arg != Py_None) {
    Py_INCREF(arg);
    g_after_op = arg;
  }
  Py_RETURN_NONE;
}

PyObject* py_set_active(PyObject*, PyObject* arg) {
  g_active.store(PyObject_IsTrue(arg) == 1);
  Py_RETURN_NONE;
}

// ---------------------------------------------------------------- draining the spool
// What a block refers to by id (sids, sites, groups).  Ids are gathered while walking
// the records without the lock (a loop repeats the same few: consecutive repeats are
// skipped), then listed once each under it (``unique``).
struct Refs {
  std::vector<int64_t> sigs, sites, groups;
  static void add(std::vector<int64_t>& out, int64_t id) {
    if (id >= 0 && (out.empty() || out.back() != id)) out.push_back(id);
  }
  void add_body(const uint8_t* body) {  // a BeginBody (BEGIN, SIG): its site and group
    BeginBody b;
    std::memcpy(&b, body, sizeof b);
    add(sites, b.site);
    add(groups, b.gid);
  }
  // Under S->mu: each id once, known ids only.
  static void unique(std::vector<int64_t>& ids, std::vector<uint32_t>& marks, const std::vector<std::string>& recs) {
    size_t k = 0;
    for (int64_t id : ids) {
      if (size_t(id) >= marks.size() || size_t(id) >= recs.size() || marks[size_t(id)] == S->drain_no) continue;
      marks[size_t(id)] = S->drain_no;
      ids[k++] = id;
    }
    ids.resize(k);
  }
};

// The records in [from, to) of the ring: whole records, in order (a length that makes no
// sense stops the walk there: nothing after it can be trusted).  Calls f(record, len).
template <class F>
uint64_t walk_ring(uint64_t from, uint64_t to, F&& f) {
  uint64_t pos = from;
  while (pos + sizeof(Header) <= to) {
    const uint8_t* r = S->ring + (pos & S->ring_mask);
    uint32_t len;
    std::memcpy(&len, r + offsetof(Header, len), 4);
    if (len < sizeof(Header) || len > kMaxRecord || pos + len > to) break;
    f(r, len);
    pos += len;
  }
  return pos;
}

// The block of records [S->drained, head): the table records they refer to (restated,
// so that the block decodes on its own: any suffix of a stream is readable), then the
// records.  Appends it to S->scratch; returns (records, end position).
std::pair<uint64_t, uint64_t> build_block(uint64_t start, uint64_t end) {
  S->drain_no++;
  Refs refs;
  uint64_t n = 0;
  // The records below ``head`` are whole and stay put until ``tail`` passes them: read
  // without the lock.
  end = walk_ring(start, end, [&](const uint8_t* r, uint32_t len) {
    n++;
    const uint8_t type = r[0];
    if (type == REC_BEGIN_SIG) {
      uint32_t sid;
      std::memcpy(&sid, r + sizeof(Header), 4);
      Refs::add(refs.sigs, int64_t(sid));
    } else if (type == REC_BEGIN && len >= sizeof(Header) + sizeof(BeginBody)) {
      refs.add_body(r + sizeof(Header));
    } else if (type == REC_RBEGIN && len >= sizeof(Header) + 24) {
      int32_t site, gid;
      std::memcpy(&site, r + sizeof(Header) + 16, 4);
      std::memcpy(&gid, r + sizeof(Header) + 20, 4);
      Refs::add(refs.sites, site);
      Refs::add(refs.groups, gid);
    }
  });
  ByteBuf& out = S->scratch;
  {
    Recording g;  // the tables grow under the lock
    Refs::unique(refs.sigs, S->sig_mark, S->sig_recs);
    for (int64_t sid : refs.sigs) {
      const std::string& rec = S->sig_recs[size_t(sid)];
      if (rec.size() >= sizeof(Header) + sizeof(BeginBody)) refs.add_body(reinterpret_cast<const uint8_t*>(rec.data()) + sizeof(Header));
    }
    Refs::unique(refs.sites, S->site_mark, S->site_recs);
    Refs::unique(refs.groups, S->group_mark, S->group_recs);
    size_t total = 0;
    for (int64_t id : refs.groups) total += S->group_recs[size_t(id)].size();
    for (int64_t id : refs.sites) total += S->site_recs[size_t(id)].size();
    for (int64_t id : refs.sigs) total += S->sig_recs[size_t(id)].size();
    uint8_t* p = out.grow(total);
    if (p != nullptr) {
      for (auto* list : {&refs.groups, &refs.sites, &refs.sigs}) {
        auto& recs = list == &refs.groups ? S->group_recs : list == &refs.sites ? S->site_recs : S->sig_recs;
        for (int64_t id : *list) {
          const std::string& rec = recs[size_t(id)];
          std::memcpy(p, rec.data(), rec.size());
          p += rec.size();
        }
      }
    }
  }
  uint64_t texts = 0;
  walk_ring(start, end, [&](const uint8_t* r, uint32_t len) {
    uint8_t* p = out.grow(len);
    if (p != nullptr) std::memcpy(p, r, len);
    if ((r[0] == REC_END || r[0] == REC_WAIT_END) && len > sizeof(Header) + 2) texts++;
  });
  S->block_texts = texts;
  return {n, end};
}

// What a drain covers: from the last drained position to the published head, and the
// records dropped since the last drain (the count is taken: reported once).
struct Pending {
  uint64_t start, head, dropped;
};

Pending take_pending() {
  Recording g;
  Pending p{S->drained, S->published, S->dropped};
  S->dropped = 0;
  return p;
}

// drain() -> (packed records with the table records they use, records, dropped, end position)
PyObject* py_drain(PyObject*, PyObject*) {
  auto [start, head, dropped] = take_pending();
  S->scratch.clear();
  auto [n, end] = build_block(start, head);
  S->drained = end;
  PyObject* data = PyBytes_FromStringAndSize((const char*)S->scratch.data(), Py_ssize_t(S->scratch.size()));
  if (data == nullptr) return nullptr;
  return Py_BuildValue("(NKKK)", data, (unsigned long long)n, (unsigned long long)dropped, (unsigned long long)end);
}

// ---------------------------------------------------------------- base64
// Standard base64 with padding (what Python's base64.b64encode writes).  The recorder
// thread encodes every drained byte, so the vector paths matter: AVX2 turns 24 bytes into
// 32 characters in about a dozen instructions, SSSE3 12 into 16; the scalar path (two
// characters per lookup) does the tail and every CPU without them.
const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The scalar encoder: whole groups of 3 bytes, then the padded tail.
void base64_scalar(const uint8_t* in, size_t n, char* out) {
  // Two output characters per lookup (12 bits of input): half the lookups and stores.
  static const uint16_t* T2 = [] {
    auto* t = new uint16_t[4096];
    for (int x = 0; x < 4096; x++) {
      char two[2] = {kB64[x >> 6], kB64[x & 63]};
      std::memcpy(&t[x], two, 2);
    }
    return t;
  }();
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t(in[i]) << 16) | (uint32_t(in[i + 1]) << 8) | in[i + 2];
    std::memcpy(out, &T2[v >> 12], 2);
    std::memcpy(out + 2, &T2[v & 0xFFF], 2);
    out += 4;
  }
  if (i < n) {
    uint32_t v = uint32_t(in[i]) << 16;
    if (i + 1 < n) v |= uint32_t(in[i + 1]) << 8;
    *out++ = kB64[v >> 18];
    *out++ = kB64[(v >> 12) & 63];
    *out++ = i + 1 < n ? kB64[(v >> 6) & 63] : '=';
    *out++ = '=';
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define COMMSCOPE_B64_X86 1
// The vector encoders (Muła and Lemire's method, as in aklomp/base64): each 32-bit lane
// takes 3 input bytes, splits them into four 6-bit indices (one per byte), and the
// indices become ASCII by adding an offset chosen by range (A-Z, a-z, 0-9, +, /).
// Both return how many input bytes they encoded (a multiple of 3); the caller finishes.
__attribute__((target("ssse3"))) size_t base64_ssse3(const uint8_t* in, size_t n, char* out) {
  const __m128i shuf = _mm_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
  const __m128i lut = _mm_setr_epi8(65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0);
  size_t i = 0;
  for (; i + 16 <= n; i += 12) {  // reads 16 bytes, encodes 12
    __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(in + i)), shuf);
    __m128i t0 = _mm_mulhi_epu16(_mm_and_si128(v, _mm_set1_epi32(0x0fc0fc00)), _mm_set1_epi32(0x04000040));
    __m128i t1 = _mm_mullo_epi16(_mm_and_si128(v, _mm_set1_epi32(0x003f03f0)), _mm_set1_epi32(0x01000010));
    __m128i idx = _mm_or_si128(t0, t1);
    __m128i k = _mm_subs_epu8(idx, _mm_set1_epi8(51));
    k = _mm_sub_epi8(k, _mm_cmpgt_epi8(idx, _mm_set1_epi8(25)));
    _mm_storeu_si128((__m128i*)(out + i / 3 * 4), _mm_add_epi8(idx, _mm_shuffle_epi8(lut, k)));
  }
  return i;
}

__attribute__((target("avx2"))) size_t base64_avx2(const uint8_t* in, size_t n, char* out) {
  const __m256i shuf = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10,
                                        1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
  const __m256i lut = _mm256_setr_epi8(65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0,
                                       65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0);
  size_t i = 0;
  for (; i + 28 <= n; i += 24) {  // reads 28 bytes (two 16-byte lanes, 12 apart), encodes 24
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(in + i))),
                                        _mm_loadu_si128((const __m128i*)(in + i + 12)), 1);
    v = _mm256_shuffle_epi8(v, shuf);
    __m256i t0 = _mm256_mulhi_epu16(_mm256_and_si256(v, _mm256_set1_epi32(0x0fc0fc00)),
                                    _mm256_set1_epi32(0x04000040));
    __m256i t1 = _mm256_mullo_epi16(_mm256_and_si256(v, _mm256_set1_epi32(0x003f03f0)),
                                    _mm256_set1_epi32(0x01000010));
    __m256i idx = _mm256_or_si256(t0, t1);
    __m256i k = _mm256_subs_epu8(idx, _mm256_set1_epi8(51));
    k = _mm256_sub_epi8(k, _mm256_cmpgt_epi8(idx, _mm256_set1_epi8(25)));
    _mm256_storeu_si256((__m256i*)(out + i / 3 * 4), _mm256_add_epi8(idx, _mm256_shuffle_epi8(lut, k)));
  }
  return i;
}
#endif

enum B64Impl : int { B64_AUTO = 0, B64_SCALAR = 1, B64_SSSE3 = 2, B64_AVX2 = 3 };

// The best encoder this CPU has (asked once).
int base64_best() {
#ifdef COMMSCOPE_B64_X86
  static const int best = __builtin_cpu_supports("avx2") ? B64_AVX2 : __builtin_cpu_supports("ssse3") ? B64_SSSE3 : B64_SCALAR;
  return best;
#else
  return B64_SCALAR;
#endif
}

bool base64_available(int impl) {
  if (impl == B64_AUTO || impl == B64_SCALAR) return true;
#ifdef COMMSCOPE_B64_X86
  if (impl == B64_SSSE3) return base64_best() >= B64_SSSE3;
  if (impl == B64_AVX2) return base64_best() == B64_AVX2;
#endif
  return false;
}

// base64 of in[0, n) into out (4 * ceil(n / 3) characters, no terminator).
void base64_encode(const uint8_t* in, size_t n, char* out, int impl = B64_AUTO) {
  if (impl == B64_AUTO) impl = base64_best();
  size_t done = 0;
#ifdef COMMSCOPE_B64_X86
  if (impl == B64_AVX2) done = base64_avx2(in, n, out);
  if (impl >= B64_SSSE3) done += base64_ssse3(in + done, n - done, out + done / 3 * 4);
#endif
  base64_scalar(in + done, n - done, out + done / 3 * 4);
}

// _base64(data, impl=0) -> bytes, or None where this CPU lacks impl (0 best, 1 scalar,
// 2 SSSE3, 3 AVX2): the tests compare every path with Python's base64.
PyObject* py_base64(PyObject*, PyObject* args) {
  Py_buffer in;
  int impl = B64_AUTO;
  if (!PyArg_ParseTuple(args, "y*|i", &in, &impl)) return nullptr;
  if (!base64_available(impl)) {
    PyBuffer_Release(&in);
    Py_RETURN_NONE;
  }
  size_t n = size_t(in.len);
  PyObject* out = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(4 * ((n + 2) / 3)));
  if (out != nullptr) base64_encode(static_cast<const uint8_t*>(in.buf), n, PyBytes_AS_STRING(out), impl);
  PyBuffer_Release(&in);
  return out;
}

// drain_block(rank, ts, version) -> (the ``block`` event as a JSON line, or None; records;
//                                   records dropped since the last drain; its end position;
//                                   records in it that carry a text: an error message, which
//                                   the caller redacts, blocks.mask_line)
// The block is records [drained, head) with the table records they use, base64-encoded
// here with the GIL released: the training thread never waits for the encoding.  The
// line carries the ring positions it covers (``pos``, ``end``), so a reader drops what
// it already has when a forwarder sends a dead rank's last records again.  The caller
// calls ``forwarded(end)`` once the store holds the line.
PyObject* py_drain_block(PyObject*, PyObject* args) {
  long long rank, ts;
  int version;
  if (!PyArg_ParseTuple(args, "LLi", &rank, &ts, &version)) return nullptr;
  auto [start, head, dropped] = take_pending();
  if (start == head)
    return Py_BuildValue("(OKKKK)", Py_None, 0ULL, (unsigned long long)dropped, (unsigned long long)start, 0ULL);
  ByteBuf& out = S->scratch;
  out.clear();
  uint64_t n, end;
  Py_BEGIN_ALLOW_THREADS
  std::tie(n, end) = build_block(start, head);
  Py_END_ALLOW_THREADS
  S->drained = end;
  char prefix[224];
  int np = snprintf(prefix, sizeof prefix,
                    "{\"type\":\"block\",\"v\":%d,\"rank\":%lld,\"ts\":%lld,\"n\":%llu,\"pos\":%llu,\"end\":%llu,\"data\":\"",
                    version, rank, ts, (unsigned long long)n, (unsigned long long)start, (unsigned long long)end);
  size_t b64 = 4 * ((out.size() + 2) / 3);
  PyObject* line = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(np + b64 + 2));
  if (line == nullptr) return nullptr;
  char* dst = PyBytes_AS_STRING(line);  // nobody else sees it yet: filled without the GIL
  std::memcpy(dst, prefix, size_t(np));
  Py_BEGIN_ALLOW_THREADS
  base64_encode(out.data(), out.size(), dst + np);
  Py_END_ALLOW_THREADS
  dst[np + b64] = '"';
  dst[np + b64 + 1] = '}';
  return Py_BuildValue("(NKKKK)", line, (unsigned long long)n, (unsigned long long)dropped, (unsigned long long)end,
                       (unsigned long long)S->block_texts);
}

// forwarded(end): the store holds every record before ``end``; their room is free again.
PyObject* py_forwarded(PyObject*, PyObject* arg) {
  unsigned long long end = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  SpoolHeader* h = S->hdr;
  if (end > h->tail.load(std::memory_order_relaxed) && end <= S->drained) {
    h->tail.store(end, std::memory_order_release);
    h->forwarded_ns.store(now_ns(), std::memory_order_relaxed);
  }
  Py_RETURN_NONE;
}

PyObject* py_take_groups(PyObject*, PyObject*) {
  std::vector<std::pair<int32_t, std::string>> groups;
  {
    Recording g;
    groups.swap(S->new_groups);
  }
  PyObject* out = PyList_New(0);
  for (auto& [gid, name] : groups) {
    PyObject* t = Py_BuildValue("(is#)", gid, name.data(), Py_ssize_t(name.size()));
    if (t == nullptr) {
      PyErr_Clear();
      continue;
    }
    PyList_Append(out, t);
    Py_DECREF(t);
  }
  return out;
}

// stuck(now_ns, limit_ns) -> ([(op id, thread id, parent id, waiting)] newly past the limit,
//                               ops in flight, begin of the oldest op past the limit or -1)
PyObject* py_stuck(PyObject*, PyObject* args) {
  long long now, limit;
  if (!PyArg_ParseTuple(args, "LL", &now, &limit)) return nullptr;
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t, bool>> hits;
  size_t count;
  long long oldest = -1;
  {
    Recording g;
    count = S->inflight.size();
    for (auto& [id, f] : S->inflight.items) {
      if (now - f.ts < limit) continue;
      if (oldest < 0 || f.ts < oldest) oldest = f.ts;
      if (f.reported) continue;
      f.reported = true;
      hits.emplace_back(id, f.tid, f.parent, f.waiting);
    }
    for (auto& h : hits) {  // an outer op in flight gets the stack instead
      uint64_t parent = std::get<2>(h);
      if (parent && S->inflight.contains(parent)) std::get<0>(h) = 0;
    }
  }
  PyObject* out = PyList_New(0);
  for (auto& [id, tid, parent, waiting] : hits) {
    if (id == 0) continue;
    PyObject* t = Py_BuildValue("(KKKO)", (unsigned long long)id, (unsigned long long)tid,
                                (unsigned long long)parent, waiting ? Py_True : Py_False);
    PyList_Append(out, t);
    Py_DECREF(t);
  }
  return Py_BuildValue("(NnL)", out, Py_ssize_t(count), oldest);
}

PyObject* py_last_failure(PyObject*, PyObject*) {
  Recording g;
  return PyLong_FromLongLong(S->last_failed_ns);
}

// poll_devices(): record completion of CUDA ops whose Work finished (non-blocking).
PyObject* py_poll_devices(PyObject*, PyObject*) {
  std::vector<PendingDevice> pending;
  {
    Recording g;
    if (S->device_pending.empty()) Py_RETURN_NONE;
    pending.swap(S->device_pending);
  }
  std::vector<PendingDevice> keep;
  Py_BEGIN_ALLOW_THREADS
  for (auto& p : pending) {
    bool done = false, error = false;
    std::string msg;
    try {
      done = p.work->isCompleted();
      if (done) error = !p.work->isSuccess();
    } catch (const std::exception& e) {
      done = error = true;
      msg = e.what();
    }
    if (!done) {
      keep.push_back(std::move(p));
      continue;
    }
    int64_t gpu_ns = -1;
    if (p.device) {
      try {
        float ms = p.work->getDuration();
        if (ms >= 0) gpu_ns = int64_t(double(ms) * 1e6);
      } catch (...) {
      }
    }
    Recording g;
    size_t len = sizeof(Header) + sizeof(DoneBody);
    uint8_t* q = p.device ? reserve(len) : nullptr;
    if (q) {
      put_header(q, REC_DONE, uint8_t((error ? FLAG_ERROR : 0) | FLAG_APPROX), uint32_t(len), now_ns(), p.id);
      DoneBody b{gpu_ns};
      std::memcpy(q + sizeof(Header), &b, sizeof b);
    }
    if (p.role == ROLE_TOP || p.role == ROLE_ANNOTATED || p.role == ROLE_NESTED)
      complete_locked(p.id, p.role, error, msg, true);
  }
  {
    Recording g;
    for (auto& p : keep) S->device_pending.push_back(std::move(p));
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// enter(kind, name, fragment, group, peer, direction) -> op id: a logical op described by Python
// (varlen ops, batch_isend_irecv).  Its collectives become nested (or, for a container, its
// children).  ``fragment`` is the JSON of its static fields; a collective (direction 0) or a
// p2p op (1 send, 2 recv, with peer as a group rank) takes the group's next sequence number.
PyObject* py_enter(PyObject*, PyObject* args) {
  int kind, name, peer, direction, is_async = 0;
  const char* frag;
  Py_ssize_t frag_len;
  const char* group;
  if (!PyArg_ParseTuple(args, "iiy#sii|p", &kind, &name, &frag, &frag_len, &group, &peer, &direction, &is_async))
    return nullptr;
  Tls& T = tls();
  auto& t_frames = T.frames;
  Frame fr;
  fr.id = S->next_id.fetch_add(1, std::memory_order_relaxed);
  fr.name = name;
  fr.site = current_site(T);
  fr.ts = now_ns();
  fr.parent = t_frames.empty() ? 0 : t_frames.back().id;
  fr.kind = uint8_t(kind);
  fr.async_hint = is_async != 0;
  fr.child_seen = true;
  {
    Recording g;
    int32_t gid = group_id_by_name_locked(group);
    int64_t seq = -1;
    if (kind != KIND_CONTAINER && t_frames.empty())
      seq = next_seq_locked(gid, Dir(direction), peer);
    size_t n = size_t(frag_len) > 60000 ? 60000 : size_t(frag_len);
    size_t len = sizeof(Header) + 8 + 8 + 4 + 4 + 8 + 2 + n;
    if (uint8_t* p = reserve(len)) {
      put_header(p, REC_RBEGIN, 0, uint32_t(len), fr.ts, fr.id, uint16_t(kind));
      uint8_t* q = p + sizeof(Header);
      uint64_t tid = thread_id();
      std::memcpy(q, &tid, 8);
      std::memcpy(q + 8, &fr.parent, 8);
      std::memcpy(q + 16, &fr.site, 4);
      std::memcpy(q + 20, &gid, 4);
      std::memcpy(q + 24, &seq, 8);
      uint16_t n16 = uint16_t(n);
      std::memcpy(q + 32, &n16, 2);
      std::memcpy(q + 34, frag, n);
    }
    S->inflight.put(fr.id, Inflight{fr.ts, thread_id(), fr.parent, false, false});
  }
  uint64_t id = fr.id;
  t_frames.push_back(std::move(fr));
  return PyLong_FromUnsignedLongLong(id);
}

// exit(op_id, error_text_or_None) -> tuple of the container's children ids
PyObject* py_exit(PyObject*, PyObject* args) {
  unsigned long long id;
  PyObject* text;
  if (!PyArg_ParseTuple(args, "KO", &id, &text)) return nullptr;
  auto& t_frames = tls().frames;
  if (t_frames.empty() || t_frames.back().id != id) {
    PyErr_SetString(PyExc_RuntimeError, "commscope: exit() does not match the innermost enter()");
    return nullptr;
  }
  Frame fr = std::move(t_frames.back());
  t_frames.pop_back();
  std::string msg;
  bool error = text != Py_None;
  if (error) {
    Py_ssize_t n = 0;
    const char* c = PyUnicode_AsUTF8AndSize(text, &n);
    if (c == nullptr)
      PyErr_Clear();
    else
      msg.assign(c, size_t(n));
  }
  std::vector<uint64_t> children = fr.children;
  record_exit(fr, error, msg.data(), msg.size());
  PyObject* out = PyTuple_New(Py_ssize_t(children.size()));
  for (size_t i = 0; i < children.size(); i++)
    PyTuple_SET_ITEM(out, Py_ssize_t(i), PyLong_FromUnsignedLongLong(children[i]));
  return out;
}

// track(work, ids): Work.wait() on ``work`` is recorded as waits of these ops.
PyObject* py_track(PyObject*, PyObject* args) {
  PyObject *work, *ids;
  if (!PyArg_ParseTuple(args, "OO", &work, &ids)) return nullptr;
  PyObject* seq = PySequence_Fast(ids, "ids must be a sequence");
  if (seq == nullptr) return nullptr;
  OpIds v;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    unsigned long long x = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      continue;
    }
    v.push_back(uint64_t(x));
  }
  Py_DECREF(seq);
  if (!v.empty()) track_work(work, std::move(v));
  Py_RETURN_NONE;
}

// unwaited() -> (op ids of async work never waited on: the first ones collected, then those
// still alive; how many in all)
PyObject* py_unwaited(PyObject*, PyObject*) {
  sweep_tracked();
  PyObject* out = PyList_New(0);
  auto add = [&](uint64_t id) {
    PyObject* x = PyLong_FromUnsignedLongLong(id);
    PyList_Append(out, x);
    Py_DECREF(x);
  };
  for (uint64_t id : *g_unwaited_lost) add(id);
  uint64_t alive = 0;
  for (auto& [obj, t] : *g_tracked)
    for (uint64_t id : t.ids) {
      alive++;
      if (PyList_GET_SIZE(out) < Py_ssize_t(2 * kMaxUnwaitedLost)) add(id);
    }
  return Py_BuildValue("(NK)", out, (unsigned long long)(g_unwaited_count + alive));
}

// untrack(work): the work's completion is taken through its future (get_future()): it
// will never be waited on, and that is no mistake.
PyObject* py_untrack(PyObject*, PyObject* work) {
  auto it = g_tracked->find(work);
  if (it != g_tracked->end() && PyWeakref_GetObject(it->second.ref) == work) {
    Py_DECREF(it->second.ref);
    g_tracked->erase(it);
  }
  Py_RETURN_NONE;
}

PyObject* py_reset_seqs(PyObject*, PyObject*) {
  Recording g;
  S->coll_seq.clear();
  S->p2p_seq.clear();
  S->gid_by_pg.clear();
  Py_RETURN_NONE;
}

// new_incarnation(number, suffix): the process initialised its process group again (a new
// incarnation of its rank, in a stream of its own): groups, their ids and sequence numbers
// start afresh, group names get ``suffix`` (so that ops match within an incarnation), and
// op ids start at number << 40 (unique within a rank whichever process held it before).
PyObject* py_new_incarnation(PyObject*, PyObject* args) {
  unsigned long long number;
  const char* suffix;
  if (!PyArg_ParseTuple(args, "Ks", &number, &suffix)) return nullptr;
  Recording g;
  S->coll_seq.clear();
  S->p2p_seq.clear();
  S->gid_by_pg.clear();
  S->gid_by_name.clear();
  S->new_groups.clear();
  S->group_recs.clear();
  S->group_mark.clear();
  S->resolved_source.clear();
  S->group_suffix = suffix;
  const uint64_t base = (uint64_t(number) << 40) + 1;
  if (S->next_id.load() < base) S->next_id.store(base);
  Py_RETURN_NONE;
}

PyObject* py_stats(PyObject*, PyObject*) {
  Recording g;
  const SpoolHeader* h = S->hdr;
  return Py_BuildValue("{s:K,s:K,s:K,s:n,s:n,s:n,s:K,s:K,s:K,s:O}", "seen", (unsigned long long)g_seen.load(),
                       "dropped_total", (unsigned long long)S->dropped_total, "buffered",
                       (unsigned long long)(S->staged - h->tail.load()), "inflight", Py_ssize_t(S->inflight.size()),
                       "tracked", Py_ssize_t(g_tracked->size()), "groups", Py_ssize_t(S->gid_by_name.size()),
                       "ring_size", (unsigned long long)h->ring_size, "table_used",
                       (unsigned long long)h->table_used.load(), "table_dropped", (unsigned long long)S->table_dropped,
                       "spool", S->map_file ? Py_True : Py_False);
}

// set_capacity(bytes): use at most this much of the ring (tests make the buffer tiny with it).
PyObject* py_set_capacity(PyObject*, PyObject* arg) {
  Py_ssize_t cap = PyLong_AsSsize_t(arg);
  if (cap <= 0 && PyErr_Occurred()) return nullptr;
  Recording g;
  S->limit = std::min<uint64_t>(uint64_t(cap), S->hdr->ring_size);
  Py_RETURN_NONE;
}

// ---------------------------------------------------------------- spools
uint64_t g_limit_cfg = ~0ULL;  // set_capacity's wish, kept across spools

// A spool in anonymous memory: where records go until a spool file is attached (and in
// a forked child, which must never write into its parent's file).
SpoolHeader* anon_spool(uint64_t ring_size, size_t& map_size) {
  const uint64_t slack = kMaxRecord, table = 4u << 20;
  map_size = sizeof(SpoolHeader) + ring_size + slack + table;
  void* m = mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* h = static_cast<SpoolHeader*>(m);  // zero-filled: every counter starts at 0
  std::memcpy(h->magic, "CSSPOOL1", 8);
  h->version = 1;
  h->header_size = sizeof(SpoolHeader);
  h->ring_offset = sizeof(SpoolHeader);
  h->ring_size = ring_size;
  h->slack = slack;
  h->table_offset = sizeof(SpoolHeader) + ring_size + slack;
  h->table_size = table;
  h->pid = getpid();
  h->created_ns = now_ns();
  h->rank = -1;
  return h;
}

// Records go to ``nh`` from now on.  Under S->mu.  What the old spool holds that the store
// does not (its [tail, head)) moves along at the same positions, and every table record
// is put into the new table region.
void switch_spool_locked(SpoolHeader* nh, size_t map_size, bool file) {
  SpoolHeader* oh = S->hdr;
  uint8_t* nring = reinterpret_cast<uint8_t*>(nh) + nh->ring_offset;
  const uint64_t nmask = nh->ring_size - 1;
  uint64_t head = S->staged, tail = head;
  if (oh != nullptr) {
    tail = oh->tail.load();
    while (head - tail > nh->ring_size) {  // the new ring is smaller: the oldest go (counted)
      uint32_t len;
      std::memcpy(&len, S->ring + (tail & S->ring_mask) + offsetof(Header, len), 4);
      if (len < sizeof(Header)) { tail = head; break; }
      tail += len;
      S->dropped++;
      S->dropped_total++;
    }
    uint64_t pos = tail;
    walk_ring(tail, head, [&](const uint8_t* r, uint32_t len) {
      std::memcpy(nring + (pos & nmask), r, len);
      pos += len;
    });
    head = pos;
  }
  nh->tail.store(tail);
  nh->head.store(head);
  nh->dropped.store(S->dropped_total);
  nh->table_used.store(0);
  void* old_map = oh;
  const size_t old_size = S->map_size;
  S->hdr = nh;
  S->ring = nring;
  S->ring_mask = nmask;
  S->table = reinterpret_cast<uint8_t*>(nh) + nh->table_offset;
  S->map_size = map_size;
  S->map_file = file;
  S->staged = S->published = head;
  if (S->drained < tail || S->drained > head) S->drained = tail;
  S->limit = std::min<uint64_t>(g_limit_cfg, nh->ring_size);
  for (auto* recs : {&S->group_recs, &S->site_recs, &S->sig_recs})
    for (const std::string& rec : *recs) {
      const uint64_t used = nh->table_used.load(std::memory_order_relaxed);
      if (rec.empty()) continue;
      if (used + rec.size() > nh->table_size) {
        S->table_dropped++;
        continue;
      }
      std::memcpy(S->table + used, rec.data(), rec.size());
      nh->table_used.store(used + rec.size(), std::memory_order_release);
    }
  if (old_map != nullptr) munmap(old_map, old_size);
}

// attach_spool(fd): records go to the spool file spool.py created (and initialised) on
// ``fd`` from now on; returns its ring size.  Called with the recorder thread's tick lock
// held (the drain reads the ring without S->mu).
PyObject* py_attach_spool(PyObject*, PyObject* args) {
  int fd;
  if (!PyArg_ParseTuple(args, "i", &fd)) return nullptr;
  SpoolHeader probe;
  if (pread(fd, &probe, sizeof probe, 0) != ssize_t(sizeof probe) || std::memcmp(probe.magic, "CSSPOOL1", 8) != 0 ||
      probe.version != 1 || probe.header_size != sizeof(SpoolHeader) || probe.ring_size == 0 ||
      (probe.ring_size & (probe.ring_size - 1)) != 0 || probe.slack < kMaxRecord ||
      probe.ring_offset != sizeof(SpoolHeader) || probe.table_offset != sizeof(SpoolHeader) + probe.ring_size + probe.slack) {
    PyErr_SetString(PyExc_ValueError, "commscope: not a spool file of this layout");
    return nullptr;
  }
  const size_t size = size_t(probe.table_offset + probe.table_size);
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
  {
    Recording g;
    switch_spool_locked(static_cast<SpoolHeader*>(m), size, true);
  }
  return PyLong_FromUnsignedLongLong(probe.ring_size);
}

// detach_spool(): back to anonymous memory (what the file does not hand over is copied).
PyObject* py_detach_spool(PyObject*, PyObject*) {
  size_t size;
  SpoolHeader* h = anon_spool(S->hdr->ring_size, size);
  if (h == nullptr) return PyErr_SetFromErrno(PyExc_OSError);
  Recording g;
  switch_spool_locked(h, size, false);
  Py_RETURN_NONE;
}

// note_group(name, backend, granks or None): a group's members, from Python.
PyObject* py_note_group(PyObject*, PyObject* args) {
  const char *name, *backend;
  PyObject* ranks;
  if (!PyArg_ParseTuple(args, "ssO", &name, &backend, &ranks)) return nullptr;
  std::vector<int32_t> granks;
  bool known = ranks != Py_None;
  if (known) {
    PyObject* seq = PySequence_Fast(ranks, "granks must be a sequence");
    if (seq == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
      long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
      if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(seq);
        return nullptr;
      }
      granks.push_back(int32_t(v));
    }
    Py_DECREF(seq);
  }
  Recording g;
  int32_t gid = group_id_by_name_locked(name);
  put_group_locked(gid, name, backend, known ? &granks : nullptr);
  return PyLong_FromLong(gid);
}

// A table line for a forwarder: REC_META, the rank's meta (for a rank that died before its
// meta reached the store); REC_EVENT, an event the store would not take at the end.
PyObject* put_table_line(PyObject* args, uint8_t type) {
  const char* line;
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "y#", &line, &n)) return nullptr;
  std::vector<std::string> unused;
  Recording g;
  table_put(unused, nullptr, 0, table_record(type, 0, std::string(line, size_t(n))));
  Py_RETURN_NONE;
}

PyObject* py_note_meta(PyObject*, PyObject* args) { return put_table_line(args, REC_META); }
PyObject* py_keep_event(PyObject*, PyObject* args) { return put_table_line(args, REC_EVENT); }

// ---------------------------------------------------------------- deaths the process sees
// A fatal signal, std::terminate and _exit leave their cause in the spool's header (the
// records are there already); whoever forwards the spool turns it into the ``exit`` event.
// The handlers chain to what was installed before (faulthandler, whose crash file gives
// the Python stacks) and the process dies as it would have.
const int kDeathSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM};
struct sigaction g_old_action[NSIG];
bool g_armed[NSIG];
std::terminate_handler g_old_terminate = nullptr;
bool g_terminate_armed = false;

void on_death_signal(int sig, siginfo_t* info, void* ctx) {
  const struct sigaction& old = g_old_action[sig];
  const bool old_siginfo = (old.sa_flags & SA_SIGINFO) != 0;
  // SIGTERM kills only where nobody handles it (a program with its own handler lives on).
  const bool dies = sig != SIGTERM || (!old_siginfo && old.sa_handler == SIG_DFL);
  SpoolHeader* h = S != nullptr ? S->hdr : nullptr;
  if (dies && h != nullptr && g_armed[sig] && h->sig.load(std::memory_order_relaxed) == 0) {
    h->sig_code = info != nullptr ? info->si_code : 0;
    h->sig_addr = info != nullptr ? uint64_t(reinterpret_cast<uintptr_t>(info->si_addr)) : 0;
    h->sig_tid = thread_id();
    h->sig_ns = now_ns();
    h->sig.store(sig, std::memory_order_release);
  }
  if (old_siginfo) {
    if (old.sa_sigaction != nullptr) old.sa_sigaction(sig, info, ctx);
    return;
  }
  if (old.sa_handler == SIG_IGN) return;
  if (old.sa_handler == SIG_DFL) {  // die of it, as without us
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    return;
  }
  old.sa_handler(sig);
}

void on_terminate() {
  SpoolHeader* h = S != nullptr ? S->hdr : nullptr;
  if (h != nullptr && h->term_set.load() == 0) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    std::string type = t != nullptr ? t->name() : "";
    if (t != nullptr) {
      int status = 0;
      char* d = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
      if (d != nullptr) {
        type = d;
        std::free(d);
      }
    }
    std::string what;
    try {
      std::exception_ptr e = std::current_exception();
      if (e) std::rethrow_exception(e);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    size_t nt = std::min(type.size(), sizeof h->term_type), nw = std::min(what.size(), sizeof h->term_what);
    std::memcpy(h->term_type, type.data(), nt);
    std::memcpy(h->term_what, what.data(), nw);
    h->term_type_len = uint16_t(nt);
    h->term_what_len = uint16_t(nw);
    h->term_ns = now_ns();
    h->term_tid = thread_id();
    h->term_set.store(1, std::memory_order_release);
  }
  if (g_old_terminate != nullptr) g_old_terminate();
  std::abort();
}

// arm_death(): install the handlers (after faulthandler, which they chain to).
PyObject* py_arm_death(PyObject*, PyObject*) {
  for (int sig : kDeathSignals) {
    struct sigaction now;
    if (sigaction(sig, nullptr, &now) != 0) continue;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_death_signal) continue;  // armed already
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_death_signal;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, &g_old_action[sig]) == 0) g_armed[sig] = true;
  }
  if (!g_terminate_armed) {
    g_old_terminate = std::set_terminate(on_terminate);
    g_terminate_armed = true;
  }
  Py_RETURN_NONE;
}

// disarm_death(): put back what was there, where ours is still installed.
PyObject* py_disarm_death(PyObject*, PyObject*) {
  for (int sig : kDeathSignals) {
    if (!g_armed[sig]) continue;
    struct sigaction now;
    if (sigaction(sig, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_death_signal)
      sigaction(sig, &g_old_action[sig], nullptr);
    g_armed[sig] = false;
  }
  if (g_terminate_armed && std::get_terminate() == on_terminate) {
    std::set_terminate(g_old_terminate);
    g_terminate_armed = false;
  }
  Py_RETURN_NONE;
}

// note_exit(code): the process is about to leave through os._exit(code).
PyObject* py_note_exit(PyObject*, PyObject* arg) {
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return nullptr;
  SpoolHeader* h = S->hdr;
  h->exit_code = int32_t(code);
  h->exit_ns = now_ns();
  h->exit_set.store(1, std::memory_order_release);
  Py_RETURN_NONE;
}

// _die_of_cpp_exception(what): a C++ exception escapes a thread, as one escapes a backend's
// worker (Gloo's EnforceNotMet): std::terminate, then abort.  For the death tests.
PyObject* py_die_of_cpp_exception(PyObject*, PyObject* arg) {
  const char* what = PyUnicode_AsUTF8(arg);
  if (what == nullptr) return nullptr;
  std::string text(what);
  Py_BEGIN_ALLOW_THREADS
  std::thread([text] { throw std::runtime_error(text); }).join();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* py_spool_layout(PyObject*, PyObject*) {  // compared with spool.py by a test
  return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n}", "size", Py_ssize_t(sizeof(SpoolHeader)), "head",
                       Py_ssize_t(offsetof(SpoolHeader, head)), "tail", Py_ssize_t(offsetof(SpoolHeader, tail)),
                       "flags", Py_ssize_t(offsetof(SpoolHeader, flags)), "sig", Py_ssize_t(offsetof(SpoolHeader, sig)),
                       "exit_set", Py_ssize_t(offsetof(SpoolHeader, exit_set)), "term_set",
                       Py_ssize_t(offsetof(SpoolHeader, term_set)), "term_type",
                       Py_ssize_t(offsetof(SpoolHeader, term_type)), "term_what",
                       Py_ssize_t(offsetof(SpoolHeader, term_what)), "identity",
                       Py_ssize_t(offsetof(SpoolHeader, identity)));
}

PyObject* py_scalar_type_names(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  for (int i = 0; i < int(c10::ScalarType::NumOptions); i++) {
    PyObject* s = PyUnicode_FromString(c10::toString(c10::ScalarType(i)));
    PyList_Append(out, s);
    Py_DECREF(s);
  }
  return out;
}

PyObject* py_layout(PyObject*, PyObject*) {  // checked by the decoder's tests
  return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n}", "header", Py_ssize_t(sizeof(Header)), "begin",
                       Py_ssize_t(sizeof(BeginBody)), "done", Py_ssize_t(sizeof(DoneBody)), "source",
                       Py_ssize_t(sizeof(SourceBody)), "sig_begin", Py_ssize_t(sizeof(SigBeginBody)));
}

void after_fork_child() {
  // A forked child (DataLoader worker) records nothing, must not wait on a lock that a
  // thread of the parent held at fork time, and must never write into (or die into) the
  // parent's spool, which it shares.
  g_active.store(false);
  new (&S->mu) RecordLock();
  size_t size;
  SpoolHeader* h = anon_spool(1u << 16, size);
  if (h != nullptr) {
    S->hdr = h;  // the parent's mapping stays mapped (the child may not unmap what it never owned)
    S->ring = reinterpret_cast<uint8_t*>(h) + h->ring_offset;
    S->ring_mask = h->ring_size - 1;
    S->table = reinterpret_cast<uint8_t*>(h) + h->table_offset;
    S->map_size = size;
    S->map_file = false;
    S->staged = S->published = S->drained = 0;
    S->limit = h->ring_size;
  }
  S->inflight.clear();
  S->device_pending.clear();
}

PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS,
     "install(ops, is_internal, work_type, site_text) -> registered op names; ops: (operator, direction, describe)"},
    {"uninstall", py_uninstall, METH_NOARGS, "stop observing and remove the kernels"},
    {"set_active", py_set_active, METH_O, "pause or resume recording"},
    {"set_after_op", py_set_after_op, METH_O, "call this once after the next recorded call returns"},
    {"drain", py_drain, METH_NOARGS, "drain() -> (packed records with their tables, records, dropped, end position)"},
    {"drain_block", py_drain_block, METH_VARARGS,
     "drain_block(rank, ts, version) -> (block event line or None, records, records dropped since last, end position)"},
    {"take_groups", py_take_groups, METH_NOARGS, "new (gid, name) since the last call"},
    {"forwarded", py_forwarded, METH_O, "forwarded(end): the store holds every record before end"},
    {"attach_spool", py_attach_spool, METH_VARARGS, "attach_spool(fd) -> ring size: record into this spool file"},
    {"detach_spool", py_detach_spool, METH_NOARGS, "record into anonymous memory again"},
    {"note_group", py_note_group, METH_VARARGS, "note_group(name, backend, granks or None) -> group id"},
    {"note_meta", py_note_meta, METH_VARARGS, "note_meta(line): the meta event, kept in the spool"},
    {"keep_event", py_keep_event, METH_VARARGS, "keep_event(line): an event the store did not take, kept in the spool"},
    {"arm_death", py_arm_death, METH_NOARGS, "note fatal signals and std::terminate in the spool"},
    {"disarm_death", py_disarm_death, METH_NOARGS, "put the previous handlers back"},
    {"note_exit", py_note_exit, METH_O, "note_exit(code): the process leaves through os._exit"},
    {"spool_layout", py_spool_layout, METH_NOARGS, "spool header offsets"},
    {"_die_of_cpp_exception", py_die_of_cpp_exception, METH_O, "a C++ exception escapes a thread (test hook)"},
    {"stuck", py_stuck, METH_VARARGS, "stuck(now_ns, limit_ns) -> ([(id, tid, parent, waiting)], in flight, oldest stuck begin or -1)"},
    {"poll_devices", py_poll_devices, METH_NOARGS, "record completed CUDA work"},
    {"last_failure", py_last_failure, METH_NOARGS, "when an op last raised (ns; 0: never)"},
    {"enter", py_enter, METH_VARARGS, "enter(kind, name, fragment, group, peer, direction, async=False) -> op id"},
    {"exit", py_exit, METH_VARARGS, "exit(op id, error text or None) -> container children ids"},
    {"track", py_track, METH_VARARGS, "track(work, ids)"},
    {"unwaited", py_unwaited, METH_NOARGS, "(op ids of async work never waited on, how many in all)"},
    {"untrack", py_untrack, METH_O, "untrack(work): its completion is taken through its future"},
    {"reset_seqs", py_reset_seqs, METH_NOARGS, "forget sequence numbers (the process group was destroyed)"},
    {"new_incarnation", py_new_incarnation, METH_VARARGS, "new_incarnation(number, group name suffix)"},
    {"stats", py_stats, METH_NOARGS, "counters"},
    {"set_capacity", py_set_capacity, METH_O, "buffer capacity in bytes"},
    {"scalar_type_names", py_scalar_type_names, METH_NOARGS, "c10 ScalarType names by code"},
    {"layout", py_layout, METH_NOARGS, "record struct sizes"},
    {"_base64", py_base64, METH_VARARGS, "_base64(data, impl=0) -> base64 bytes, or None where the CPU lacks impl (test hook)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "commscope_native", "commscope's native recorder", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_commscope_native(void) {
  if (S == nullptr) {
    S = new State();
    g_lib = new std::unique_ptr<torch::Library>();
    g_specs = new std::unordered_map<std::string, OpSpec>();
    g_code_internal = new std::unordered_map<PyObject*, int8_t>();
    g_sites = new std::map<std::pair<PyObject*, int>, int32_t>();
    g_tracked = new std::unordered_map<PyObject*, Tracked>();
    g_unwaited_lost = new std::vector<uint64_t>();
    pthread_atfork(nullptr, nullptr, after_fork_child);
    pthread_key_create(&g_tls_key, tls_free);
    size_t size;
    SpoolHeader* h = anon_spool(16u << 20, size);
    if (h == nullptr) {
      PyErr_SetFromErrno(PyExc_OSError);
      return nullptr;
    }
    Recording g;
    switch_spool_locked(h, size, false);
  }
  WrapperType.tp_name = "commscope_native.Wrapper";
  WrapperType.tp_basicsize = sizeof(WrapperObject);
  WrapperType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  WrapperType.tp_new = wrapper_new;
  WrapperType.tp_dealloc = wrapper_dealloc;
  WrapperType.tp_traverse = wrapper_traverse;
  WrapperType.tp_clear = wrapper_clear;
  WrapperType.tp_call = PyVectorcall_Call;
  WrapperType.tp_vectorcall_offset = offsetof(WrapperObject, vectorcall);
  WrapperType.tp_dictoffset = offsetof(WrapperObject, dict);
  WrapperType.tp_weaklistoffset = offsetof(WrapperObject, weakrefs);
  WrapperType.tp_getset = wrapper_getset;
  WrapperType.tp_doc = "Wrapper(orig, name, kind, async_hint=False): calls orig, recording it";
  if (PyType_Ready(&WrapperType) < 0) return nullptr;
  WaitType.tp_name = "commscope_native.WaitWrapper";
  WaitType.tp_basicsize = sizeof(WaitObject);
  // A method descriptor: ``work.wait()`` calls it with the Work as first argument, no
  // bound method made per call.
  WaitType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
  WaitType.tp_new = wait_new;
  WaitType.tp_dealloc = wait_dealloc;
  WaitType.tp_call = PyVectorcall_Call;
  WaitType.tp_vectorcall_offset = offsetof(WaitObject, vectorcall);
  WaitType.tp_descr_get = wait_get;
  WaitType.tp_getset = wait_getset;
  WaitType.tp_doc = "WaitWrapper(orig_wait): a Work.wait that records waits of tracked work";
  if (PyType_Ready(&WaitType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&WrapperType);
  PyModule_AddObject(m, "Wrapper", (PyObject*)&WrapperType);
  Py_INCREF(&WaitType);
  PyModule_AddObject(m, "WaitWrapper", (PyObject*)&WaitType);
  PyModule_AddIntConstant(m, "KIND_PLAIN", KIND_PLAIN);
  PyModule_AddIntConstant(m, "KIND_ANNOTATE", KIND_ANNOTATE);
  PyModule_AddIntConstant(m, "KIND_RICH", KIND_RICH);
  PyModule_AddIntConstant(m, "KIND_CONTAINER", KIND_CONTAINER);
  return m;
}
