// The packed layouts Python decodes: records (commscope/blocks.py) and the spool header (commscope/store/spool.py).
// Apart so that a format change is one file, its static_asserts failing the build when a size drifts.

#pragma once

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
                   // i32 ranks (-1: not known yet), i32 global rank by group rank; or i32 -2
                   // (kGroupRuns), i32 runs, then (i32 start, stride, length) per run
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

// FLAG_UNISSUED (an END's): the backend refused the op as it was called (its dispatch raised before
// issuing anything: a bad root, a bad argument); it took no sequence number (buffer.h's unissue_locked).
enum Flag : uint8_t { FLAG_ERROR = 1, FLAG_APPROX = 2, FLAG_ASYNC = 4, FLAG_ENDS_AT_COMPLETION = 8, FLAG_UNISSUED = 16 };

// Directions: a BEGIN's (and a SIG's) header aux; commscope/optable.py's DIR_*.
enum Dir : int8_t { DIR_NONE = 0, DIR_SEND = 1, DIR_RECV = 2, DIR_RECV_ANY = 3 };

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
// A text longer than its room (kMaxText; term_what's 2,048 bytes) ends in this mark ("\u2026", UTF-8) where it was cut
// (buffer.h's cut_text; blocks.cut_text the same).
constexpr char kCutMark[] = "\xe2\x80\xa6";
constexpr size_t kCutMarkLen = sizeof(kCutMark) - 1;
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
  // The first SIGTERM a handler of the program's own took (it lives on): who sent it and why
  // is unknown (a scancel, a preemption notice); the rank's exit says so (stop_signal).
  std::atomic<int32_t> stop_sig;      // 0: none
  int32_t reserved2;
  int64_t stop_ns;
  char reserved1[40];                 // its first 8 bytes: entries the rank's stream held when it last
                                      // wrote (spool.py OFF_STORED, written by the Python writer only)
  char term_type[256];                // the uncaught C++ exception's type
  char term_what[2048];               // and its what()
  char identity[1536];                // JSON written by spool.py: job, rank, store, ...
};
static_assert(sizeof(SpoolHeader) == 4096, "spool header layout (spool.py HEADER_SIZE)");
static_assert(offsetof(SpoolHeader, head) == 56 && offsetof(SpoolHeader, sig) == 128 &&
                  offsetof(SpoolHeader, stop_sig) == 200 && offsetof(SpoolHeader, term_type) == 256 &&
                  offsetof(SpoolHeader, identity) == 2560,
              "spool header layout (spool.py HEADER_FIELDS)");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<int32_t>) == 4, "plain atomics");
constexpr uint32_t SPOOL_CLOSED = 1;  // the owner forwarded everything and left

}  // namespace
