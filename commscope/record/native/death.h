// Deaths the process sees: fatal signals, std::terminate and _exit, noted in the spool's header.
// Apart: signal-handler code chained to faulthandler, none of it on the recording path.

#pragma once

namespace {

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
  // A handler of the program's own takes it (not SIG_IGN: a program that ignores it is not told).
  const bool handled = !dies && (old_siginfo ? old.sa_sigaction != nullptr : old.sa_handler != SIG_IGN);
  if (handled && h != nullptr && g_armed[sig] && h->stop_sig.load(std::memory_order_relaxed) == 0) {
    h->stop_ns = now_ns();  // the program's handler decides what follows
    h->stop_sig.store(sig, std::memory_order_release);
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
    // what() is cut as a record's text is (buffer.h's cut_text), to its whole words and the
    // mark, here in sizeof term_what: its credentials are masked when the spool is read, and
    // half of one would no longer be recognisable there.
    size_t nt = std::min(type.size(), sizeof h->term_type), nw = 0;
    const bool cut = cut_text(what.data(), what.size(), sizeof h->term_what, &nw);
    std::memcpy(h->term_type, type.data(), nt);
    std::memcpy(h->term_what, what.data(), nw);
    if (cut) std::memcpy(h->term_what + nw, kCutMark, kCutMarkLen);
    h->term_type_len = uint16_t(nt);
    h->term_what_len = uint16_t(nw + (cut ? kCutMarkLen : 0));
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

// term_watched(): whether a SIGTERM would be noted in the spool as it comes: our handler is
// still the one installed (a program's signal.signal(SIGTERM, ...) after init replaces it)
// and chains to no SIG_IGN (a SIGTERM the program ignores is noted nowhere).  The recorder
// asks each tick; where not, the spool says so (spool.py TERM_UNWATCHED), for a rank gone
// unseen with no SIGTERM noted may have had one all the same.
PyObject* py_term_watched(PyObject*, PyObject*) {
  struct sigaction now;
  const struct sigaction& old = g_old_action[SIGTERM];
  const bool ours = g_armed[SIGTERM] && sigaction(SIGTERM, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) &&
                    now.sa_sigaction == on_death_signal;
  const bool ignored = !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN;
  return PyBool_FromLong(ours && !ignored);
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

}  // namespace
