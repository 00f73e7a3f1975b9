// The CPython wrappers (Wrapper, WaitWrapper) and what they need with the GIL held: call sites, exception text,
// tracked Work.  Apart from the kernel: this side runs under the GIL and holds Python objects.

#pragma once

namespace {

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
      else put_u16_cut_text(body, c, size_t(n));
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
          // (more than a record holds: write_text_record cuts it before a whole word)
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
  auto flags_of = [&](uint64_t id) -> uint8_t {  // an op the backend refused says so (kernel.h)
    if (!error || fr.unissued.empty()) return flags;
    const bool refused = std::find(fr.unissued.begin(), fr.unissued.end(), id) != fr.unissued.end();
    return flags | (refused ? FLAG_UNISSUED : 0);
  };
  if (fr.kind == KIND_CONTAINER) {
    for (uint64_t child : fr.children)
      write_text_record(REC_END, flags_of(child), ts, child, text, error ? text_len : 0);
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
  write_text_record(REC_END, flags_of(fr.id), ts, fr.id, text, error ? text_len : 0);
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

}  // namespace
