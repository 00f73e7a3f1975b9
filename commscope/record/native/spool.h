// Spools: anonymous memory, a spool file attached (spool.py's) and records moved between them, a forked child's,
// and the table records Python adds.  Apart: the only code that changes where the records live.

#pragma once

namespace {

// ---------------------------------------------------------------- spools

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
    S->cut_set = false;
    S->limit = h->ring_size;
  }
  S->inflight.clear();
  // Leaked, not destroyed: the parent's works and CUDA events must not be freed in a child
  // (CUDA cannot be used after fork).
  new std::vector<PendingDevice>(std::move(S->device_pending));
  new std::vector<std::unique_ptr<c10::Event>>(std::move(S->event_pool));
  S->device_pending.clear();
  S->event_pool.clear();
}

}  // namespace
