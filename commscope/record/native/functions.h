// The module functions without a part of their own: install, logical ops and tracked work from Python, the
// watchdog's queries, counters, layout hooks.  Apart from commscope_native.cpp's method table, which lists them.

#pragma once

namespace {

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
  std::vector<std::unique_ptr<c10::Event>> freed;
  for (auto& p : pending) {
    bool done = false, error = false;
    std::string msg;
    int64_t gpu_ns = -1;
    if (!p.work) {  // our event pair (a synchronous CUDA op)
      try {
        done = p.end->query();
        if (done) gpu_ns = int64_t(p.start->elapsedTime(*p.end) * 1e6);
      } catch (...) {
        done = true;  // e.g. the context is being torn down: DONE without a duration
      }
      if (!done) {
        keep.push_back(std::move(p));
        continue;
      }
      freed.push_back(std::move(p.start));
      freed.push_back(std::move(p.end));
    } else {
      try {
        done = p.work->isCompleted();
        // exception(), not isSuccess(): WorkNCCL's isSuccess throws ("deprecated")
        if (done) error = p.work->exception() != nullptr;
      } catch (const std::exception& e) {
        done = error = true;
        msg = e.what();
      }
      if (!done) {
        keep.push_back(std::move(p));
        continue;
      }
      if (p.device) {
        try {
          float ms = p.work->getDuration();
          if (ms >= 0) gpu_ns = int64_t(double(ms) * 1e6);
        } catch (...) {
        }
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
    for (auto& e : freed)
      if (S->event_pool.size() < 1024) S->event_pool.push_back(std::move(e));
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
  S->cut_set = false;
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
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:n,s:n,s:n,s:K,s:K,s:K,s:O}", "seen", (unsigned long long)g_seen.load(),
                       "drained", (unsigned long long)S->drained,
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
  g_limit_cfg = uint64_t(cap);  // a spool attached later keeps it
  S->limit = std::min<uint64_t>(g_limit_cfg, S->hdr->ring_size);
  Py_RETURN_NONE;
}

PyObject* py_spool_layout(PyObject*, PyObject*) {  // compared with spool.py by a test
  return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n}", "size", Py_ssize_t(sizeof(SpoolHeader)), "head",
                       Py_ssize_t(offsetof(SpoolHeader, head)), "tail", Py_ssize_t(offsetof(SpoolHeader, tail)),
                       "flags", Py_ssize_t(offsetof(SpoolHeader, flags)), "sig", Py_ssize_t(offsetof(SpoolHeader, sig)),
                       "exit_set", Py_ssize_t(offsetof(SpoolHeader, exit_set)), "term_set",
                       Py_ssize_t(offsetof(SpoolHeader, term_set)), "stop_sig",
                       Py_ssize_t(offsetof(SpoolHeader, stop_sig)), "term_type",
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

}  // namespace
