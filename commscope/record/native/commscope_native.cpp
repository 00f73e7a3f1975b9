// commscope_native.cpp: the native recorder's one translation unit: external headers, its parts (the .h files
// beside it, one concern each, included here only, so torch's headers are compiled once) and the module itself.
//
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
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/debug.h>

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

// The parts, in the order they build on each other.  Each opens the anonymous namespace: everything but
// PyInit_commscope_native is internal to this module.
#include "layout.h"     // record and spool-header layouts (static_asserted)
#include "buffer.h"     // State, the lock, appending records and table records
#include "kernel.h"     // the c10d dispatcher kernel (GIL released)
#include "wrappers.h"   // Wrapper, WaitWrapper, call sites, tracked Work (GIL held)
#include "functions.h"  // install, enter/exit, track, stuck, stats, ...
#include "base64.h"     // the block encoders
#include "drain.h"      // drain, drain_block, forwarded
#include "spool.h"      // anonymous and file spools, after fork
#include "death.h"      // fatal signals, std::terminate, _exit

namespace {

// ---------------------------------------------------------------- the module
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
    {"term_watched", py_term_watched, METH_NOARGS, "whether a SIGTERM would be noted in the spool"},
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
