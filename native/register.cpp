// Construction and destruction of a group, and the Python module.
//
// Python (native/__init__.py) registers the backend with
// torch.distributed.Backend.register_backend and calls create() for every
// process group; torch then dispatches every collective of that group to the
// returned c10d::Backend.
#include <torch/extension.h>

#include "native.hpp"

#include <pthread.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

namespace native {

NativeBackend::NativeBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Ms timeout,
                             std::vector<int64_t> globalRanks, const std::string& groupName)
    : c10d::Backend(rank, size), store_(store), timeout_(timeout), globalRanks_(std::move(globalRanks)) {
  TORCH_CHECK(size >= 1 && size <= kMaxRanks, "native: a group has 1..", kMaxRanks, " ranks, not ", size);
  TORCH_CHECK(timeout.count() > 0, "native: the group timeout must be positive");
  segment_ = std::make_unique<Segment>(store, rank, size, timeout);
  initSync();
  std::vector<int64_t> ranks = globalRanks_;  // the default group comes without them: every rank
  if (ranks.empty())
    for (int r = 0; r < size; ++r) ranks.push_back(r);
  frGroup_ = FlightRecorder::get().addGroup(this, groupName, std::move(ranks));
  worker_ = std::thread([this] { workerLoop(); });
  // named here, not only by the thread itself: a thread the scheduler has not run yet (a loaded machine) would
  // show under its creator's name to a probe, ps -T or py-spy (tests/test_native.py counted one worker short)
  pthread_setname_np(worker_.native_handle(), "native-worker");
  startP2P();
}

NativeBackend::~NativeBackend() {
  shutdown();
  if (frGroup_) FlightRecorder::get().forget(frGroup_);
}

void NativeBackend::setGroupUid(const std::string& pgUid) {
  c10d::Backend::setGroupUid(pgUid);
  if (frGroup_) FlightRecorder::get().rename(frGroup_, pgUid);
}

void NativeBackend::abort() {
  aborted_.store(true);
  shutdown();
}

void NativeBackend::shutdown() {
  std::lock_guard<std::mutex> once(shutdownLock_);
  if (shutDown_) return;
  shutDown_ = true;
  {
    std::lock_guard<std::mutex> guard(queueLock_);
    stopping_ = true;
  }
  queueCv_.notify_all();
  if (worker_.joinable()) worker_.join();  // runs what was queued; each job ends by its deadline
  p2pStop_.store(true);
  ring(segment_->control(getRank())->p2pBell, nullptr);
  if (progress_.joinable()) progress_.join();
  {
    std::lock_guard<std::mutex> guard(p2pLock_);
    for (auto& recv : posted_)
      recv->work->fail(std::make_exception_ptr(std::runtime_error("native: " + recv->work->what +
                                                                  ": the group was shut down")));
    posted_.clear();
    unexpected_.clear();
  }
  segment_.reset();  // unmaps; the name was unlinked when every rank had mapped it
}

c10::intrusive_ptr<c10d::Backend> NativeBackend::shrink(const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
                                                        const c10::intrusive_ptr<Options>& optsOverride) {
  const int n = getSize();
  std::vector<bool> excluded(n, false);
  std::string key = "native/shrink/";
  for (int64_t r : ranksToExclude) {
    TORCH_CHECK(r >= 0 && r < n, "native: shrink: rank ", r, " is not a rank of this group (0..", n - 1, ")");
    excluded[r] = true;
  }
  TORCH_CHECK(!excluded[getRank()], "native: shrink: rank ", getRank(), " is excluded and must not take part");
  int newRank = -1;
  std::vector<int64_t> kept;
  for (int r = 0; r < n; ++r) {
    if (excluded[r]) {
      key += std::to_string(r) + ",";
      continue;
    }
    if (r == getRank()) newRank = static_cast<int>(kept.size());
    kept.push_back(globalRanks_.empty() ? r : globalRanks_[r]);
  }
  TORCH_CHECK(!kept.empty(), "native: shrink would exclude every rank");
  // every kept rank shrinks this group by the same set the same number of times: one key each time
  key += "#" + std::to_string(++shrinks_[key]) + "/";
  const bool overridden = optsOverride && optsOverride->timeout.count() > 0;
  // planted: the shrunk group keeps the parent's timeout
  const Ms timeout = overridden && !planted(PlantedBug::shrink_ignores_options) ? optsOverride->timeout : timeout_;
  if (planted(PlantedBug::shrink_waits_for_excluded))  // planted: the shrunk group still counts the excluded ranks
    for (int64_t r : ranksToExclude) kept.push_back(globalRanks_.empty() ? r : globalRanks_[r]);
  auto shrunk = c10::make_intrusive<NativeBackend>(c10::make_intrusive<c10d::PrefixStore>(key, store_), newRank,
                                                   static_cast<int>(kept.size()), timeout, kept);
  (void)shrinkFlags;  // SHRINK_ABORT: this group's queued collectives end by their own deadlines
  return shrunk;
}

c10::intrusive_ptr<c10d::Backend> NativeBackend::merge(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const c10::intrusive_ptr<Options>& opts, const int& rank,
                                                       const int& size) {
  // c10d passes this group's getBackendOptions() with the merge's timeout and name in it
  const bool given = opts && opts->timeout.count() > 0;
  // planted: the merged group keeps this (parent) group's timeout
  const Ms timeout = given && !planted(PlantedBug::merge_ignores_timeout) ? opts->timeout : timeout_;
  // the store is the merge's own (every merging group passes the same one), shared with c10d's rank counter
  return c10::make_intrusive<NativeBackend>(c10::make_intrusive<c10d::PrefixStore>("native/merge/", store), rank,
                                            size, timeout, std::vector<int64_t>{});
}

c10::intrusive_ptr<c10d::Backend::Options> NativeBackend::getBackendOptions() {
  auto options = c10::make_intrusive<Options>("native", timeout_);
  return options;
}

}  // namespace native

namespace {
// The names create(planted_bug=...) takes, in PlantedBug's order (native.hpp).
constexpr const char* kPlantedBugNames[] = {"none", "skip_last_rank", "early_completion", "no_timeout",
                                             "any_source_rank0", "premul_first_only", "complex_as_real",
                                             "abort_waits", "shrink_ignores_options", "shrink_waits_for_excluded",
                                             "fr_never_completed", "merge_ignores_timeout"};

native::PlantedBug plantedBugNamed(const std::string& name) {
  std::string known;
  for (size_t i = 0; i < std::size(kPlantedBugNames); ++i) {
    if (name == kPlantedBugNames[i]) return static_cast<native::PlantedBug>(i);
    known += std::string(i ? ", " : "") + "'" + kPlantedBugNames[i] + "'";
  }
  throw py::value_error("native: unknown planted bug '" + name + "'; known: " + known);
}
static_assert(std::size(kPlantedBugNames) == static_cast<size_t>(native::PlantedBug::merge_ignores_timeout) + 1,
              "a name for each PlantedBug");
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "distconform's native c10d backend (shared memory between the ranks of one host)";
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeoutSeconds,
         std::vector<int64_t> globalRanks, const std::string& plantedBug, const std::string& groupName,
         int64_t recorderSize) -> c10::intrusive_ptr<c10d::Backend> {
        native::gPlantedBug.store(plantedBugNamed(plantedBug));  // before the group exists: it runs with it
        native::FlightRecorder::get().sizeOnce(recorderSize);    // the process's first group sizes it
        return c10::make_intrusive<native::NativeBackend>(
            store, rank, size, native::Ms(static_cast<int64_t>(timeoutSeconds * 1000)), std::move(globalRanks),
            groupName);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"), py::arg("global_ranks"),
      py::arg("planted_bug") = "none", py::arg("group_name") = "", py::arg("recorder_size") = 0,
      py::call_guard<py::gil_scoped_release>());
  // the flight recorder's contents, as plain data: native/flight_recorder.py formats them as torch's dumps
  m.def("flight_records", [] {
    native::FlightRecorder::Snapshot snap;
    {
      py::gil_scoped_release release;  // the recorder's lock is taken by threads that never need the GIL
      snap = native::FlightRecorder::get().snapshot();
    }
    auto sizes = [](const std::vector<std::vector<int64_t>>& all) {
      py::list out;
      for (const auto& s : all) out.append(py::cast(s));
      return out;
    };
    static const char* kStates[] = {"scheduled", "started", "completed"};
    py::list entries;
    for (const auto& e : snap.entries) {
      py::dict d;
      d["record_id"] = e.recordId;
      d["pg_id"] = e.group->pgId;
      d["process_group"] = py::make_tuple(e.pgName, e.pgDesc);
      d["thread_name"] = e.threadName;
      d["thread_id"] = e.threadId;
      d["collective_seq_id"] = e.collectiveSeqId;
      d["p2p_seq_id"] = e.p2pSeqId;
      d["op_id"] = e.opId;
      d["profiling_name"] = e.profilingName;
      d["time_created_ns"] = e.timeCreatedNs;
      d["input_sizes"] = sizes(e.inputSizes);
      d["input_dtypes"] = py::cast(e.inputDtypes);
      d["output_sizes"] = sizes(e.outputSizes);
      d["output_dtypes"] = py::cast(e.outputDtypes);
      d["state"] = kStates[static_cast<int>(e.state)];
      d["time_discovered_started_ns"] = e.timeStartedNs ? py::cast(e.timeStartedNs) : py::none();
      d["time_discovered_completed_ns"] = e.timeCompletedNs ? py::cast(e.timeCompletedNs) : py::none();
      d["retired"] = e.retired;
      d["timeout_ms"] = e.timeoutMs;
      d["is_p2p"] = e.isP2p;
      entries.append(d);
    }
    py::list groups;
    for (const auto& g : snap.groups) {
      py::dict d;
      d["name"] = g.name;
      d["desc"] = g.desc;
      d["ranks"] = py::cast(g.ranks);
      d["last_enqueued_collective"] = g.enqueued;
      d["last_started_collective"] = g.started;
      d["last_completed_collective"] = g.completed;
      groups.append(d);
    }
    py::dict out;
    out["capacity"] = snap.capacity;
    out["errors"] = snap.errors;
    out["entries"] = entries;
    out["groups"] = groups;
    return out;
  });
  // the seeded bugs this build can plant (create's planted_bug), and the one this process runs with
  py::list names;
  for (const char* name : kPlantedBugNames) names.append(name);
  m.attr("PLANTED_BUGS") = py::tuple(names);
  m.def("planted_bug", [] { return std::string(kPlantedBugNames[static_cast<int>(native::gPlantedBug.load())]); });
  m.attr("MAX_RANKS") = native::kMaxRanks;
}
