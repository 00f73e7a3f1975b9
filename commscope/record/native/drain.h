// Draining the spool (the recorder thread): a block of records with the table records it uses, base64-encoded
// into an event line without the GIL.  Apart from the writers: it reads the ring without the lock.

#pragma once

namespace {

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
  // (up to where take_groups() cut, where it did this tick: records published since may use
  // a group registered since, whose members the tables do not have yet; they go next tick)
  const bool cut = S->cut_set && S->cut >= S->drained && S->cut <= S->published;
  const uint64_t head = cut ? S->cut : S->published;
  S->cut_set = false;
  Pending p{S->drained, head, S->dropped};
  S->taken = head;  // read without the lock from here on: no longer changed in place (unissue_locked)
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

// take_groups() -> [(gid, name)] of the groups registered since the last call, whose members
// the caller tells the tables (note_group) before it drains: the next drain_block ends where
// the records stood now, so its block restates each group it uses with its members.  A group
// first used after this call goes in the next block (before, a block drained while the
// training thread first used a group restated it without members; a rank then blocked in its
// first collective wrote no later block, and its hang was never found: nobody was missing).
PyObject* py_take_groups(PyObject*, PyObject*) {
  std::vector<std::pair<int32_t, std::string>> groups;
  {
    Recording g;
    groups.swap(S->new_groups);
    S->cut = S->published;
    S->cut_set = true;
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

}  // namespace
