// The dispatcher kernel: operator specs, each thread's state and the boxed kernel at BackendSelect that observes
// every c10d op.  Apart: the hot path of every collective, and it never touches Python (no GIL held).

#pragma once

namespace {

// ---------------------------------------------------------------- operator specs
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
  std::vector<uint64_t> unissued;  // its ops the backend refused, their numbers given back (record_exit's END: FLAG_UNISSUED)
};
struct Frame;

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
  uint64_t observed = 0;      // ops this thread's kernel has observed (a dispatch that issued some has moved it)
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
void complete_locked(uint64_t id, uint8_t role, bool error, const std::string& msg, bool approx,
                     uint8_t more = 0) {
  // Ops that end at completion: issued from C++, annotated, nested.  A merged op ends
  // when the Python call returns; its completion is only noted for device ops (DONE).
  if (role == ROLE_NESTED && S->open_nested.erase(id) == 0) return;  // closed when its call returned
  int64_t ts = now_ns();
  uint8_t flags = (error ? FLAG_ERROR : 0) | (approx ? FLAG_APPROX : 0) | more;
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

// Whether a dispatch that raised was the backend refusing the op as it was called (a bad
// root, a bad argument: Gloo's and NCCL's checks before they issue anything), so that it was
// never issued and takes no sequence number.  Not: a distributed error (a timeout, a closed
// connection, a store or NCCL failure: DistError, thrown by the caller of this, never here), an
// op that communicates inside its dispatch (one that returns no Work: monitored_barrier), one
// whose dispatch observed other ops first (``issued_any``: TORCH_DISTRIBUTED_DEBUG=DETAIL's
// checks run collectives before the backend sees the op), or any op under DETAIL at all.
bool refused(const OpSpec* spec, bool issued_any) {
  return spec->returns_work && !issued_any && c10d::debug_level() != c10d::DebugLevel::Detail;
}

// A timing event recorded on `device`'s current stream (asynchronous, no sync), from the
// pool when one is free; null where CUDA refuses (the op is then recorded without DONE).
std::unique_ptr<c10::Event> record_cuda_event(int8_t device) {
  std::unique_ptr<c10::Event> ev;
  {
    Recording g;
    if (!S->event_pool.empty()) {
      ev = std::move(S->event_pool.back());
      S->event_pool.pop_back();
    }
  }
  try {
    if (ev && ev->device_index() >= 0 && ev->device_index() != device) ev.reset();  // another device's
    if (!ev) ev = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    const c10::Device dev(c10::DeviceType::CUDA, device);
    ev->record(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dev));
  } catch (...) {
    return nullptr;
  }
  return ev;
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
  T.observed++;
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
  int64_t seq = -1;
  uint64_t begin_pos = kNoPos;  // where its BEGIN lies in the ring (unissue_locked)
  {
    Recording g;
    gid = group_id_locked(pg);
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
      const uint64_t at = S->staged;
      uint8_t* p = reserve(len);
      if (p) {
        begin_pos = at;
        put_header(p, REC_BEGIN_SIG, 0, uint32_t(len), ts, id);
        SigBeginBody sb{sid, seq, rec_parent, thread_id()};
        std::memcpy(p + sizeof(Header), &sb, sizeof sb);
      }
    } else {  // the signature table is full: self-contained begins
      size_t len = sizeof(Header) + sizeof(BeginBody) + T.enc_in.size() + T.enc_out.size();
      const uint64_t at = S->staged;
      uint8_t* p = reserve(len);
      if (p) {
        begin_pos = at;
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

  // A synchronous CUDA op may return no work (NCCL, asyncOp=false: it runs on this stream):
  // an event before it, and one after if no work comes back, give its device duration.
  std::unique_ptr<c10::Event> cuda_start;
  if (device >= 0 && !async_op && spec->returns_work) cuda_start = record_cuda_event(device);

  const uint64_t outer_id = T.native_id;
  T.native_depth++;
  T.native_id = id;
  const uint64_t observed = T.observed;
  try {
    op.redispatchBoxed(next, stack);
  } catch (const c10::DistError& e) {  // a distributed failure: of an issued op
    T.native_depth--;
    T.native_id = outer_id;
    if (ends_at_completion) on_completed(id, role, true, e.what(), false);
    throw;
  } catch (const std::exception& e) {
    T.native_depth--;
    T.native_id = outer_id;
    // Refused by the backend as it was called: never issued.  Its number goes back (the next
    // op takes it, as torch's own sequence number does), its END says so; the exception
    // goes on unchanged.
    // Its END says FLAG_UNISSUED only where the number went back (readers withdraw the
    // begin's seq on it): not where another thread's op took the next one meanwhile.
    const bool unissued = refused(spec, T.observed != observed);
    if (unissued || ends_at_completion) {
      Recording g;
      const bool gave_back = unissued && role != ROLE_NESTED && unissue_locked(gid, spec->dir, peer, seq, id, begin_pos);
      if (gave_back && (role == ROLE_MERGED || role == ROLE_CHILD) && !T.frames.empty())
        T.frames.back().unissued.push_back(id);
      if (ends_at_completion) complete_locked(id, role, true, e.what(), false, gave_back ? FLAG_UNISSUED : 0);
    }
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
  if (!work) {  // a synchronous op (monitored_barrier, NCCL asyncOp=false): it returned here
    if (ends_at_completion) on_completed(id, role, false, std::string(), false);
    std::unique_ptr<c10::Event> cuda_end = cuda_start ? record_cuda_event(device) : nullptr;
    if (cuda_end) {  // the device finishes later: DONE when the pair has completed
      Recording g;
      if (S->device_pending.size() < 65536) {
        PendingDevice p{nullptr, id, ROLE_MERGED, true};  // merged: the op's END is written already
        p.start = std::move(cuda_start);
        p.end = std::move(cuda_end);
        S->device_pending.push_back(std::move(p));
      }
    }
    return;
  }
  if (cuda_start) {  // a work came back: NCCL's own timing serves; the event goes back unused
    Recording g;
    if (S->event_pool.size() < 1024) S->event_pool.push_back(std::move(cuda_start));
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

}  // namespace
