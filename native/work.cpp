// NativeWork: a c10d::Work whose future completes when the data has landed.
//
// Collectives are completed (or failed) by the group's worker thread after the
// result is in the caller's tensors; the worker enforces the timeout, so wait()
// only blocks. p2p receives are completed by the progress thread; their wait()
// is bounded by the group's timeout and withdraws the receive when it expires.
#include "native.hpp"

namespace native {

NativeWork::NativeWork(int rank, c10d::OpType type, std::string what_, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), what(std::move(what_)), outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool NativeWork::isCompleted() {
  std::lock_guard<std::mutex> guard(lock_);
  return done_;
}

bool NativeWork::isSuccess() const {
  std::lock_guard<std::mutex> guard(lock_);
  return done_ && !error_;
}

std::exception_ptr NativeWork::exception() const {
  std::lock_guard<std::mutex> guard(lock_);
  return error_;
}

int NativeWork::sourceRank() const {
  std::lock_guard<std::mutex> guard(lock_);
  return source_;
}

std::vector<at::Tensor> NativeWork::result() {
  wait();
  return outputs_;
}

// Before the future and any waiter: an entry read after wait() returned says "completed".
void NativeWork::recordCompletion() {
  if (planted(PlantedBug::fr_never_completed)) return;  // planted: entries stay "started" for ever
  FlightRecorder::get().completed(recordId);
}

// The future completes first: whoever returns from wait() may read it at once
// (DDP's Join hook reads work.get_future().value() right after wait()).
void NativeWork::complete(int source) {
  {
    std::lock_guard<std::mutex> guard(lock_);
    if (done_ || finishing_) return;
    finishing_ = true;
    source_ = source;
    ended_ = Clock::now();
  }
  recordCompletion();
  future_->markCompleted(c10::IValue(outputs_));
  {
    std::lock_guard<std::mutex> guard(lock_);
    done_ = true;
  }
  doneCv_.notify_all();
}

void NativeWork::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> guard(lock_);
    if (done_ || finishing_) return;
    finishing_ = true;
    error_ = error;
    ended_ = Clock::now();
  }
  if (!planted(PlantedBug::fr_never_completed)) FlightRecorder::get().failed(recordId);  // retired, not completed
  future_->setError(error);
  {
    std::lock_guard<std::mutex> guard(lock_);
    done_ = true;
  }
  doneCv_.notify_all();
}

bool NativeWork::wait(Ms timeout) {
  // Without a timeout of its own, the waiting thread runs the queued jobs
  // (ours, or one queued before it, whichever is next); wait(timeout) must
  // return at its timeout, so it leaves them to the worker.
  if (help && !(timeout != kNoTimeout && timeout.count() > 0)) {
    while (!isCompleted() && help()) {
    }
  }
  std::unique_lock<std::mutex> guard(lock_);
  Ms limit = timeout != kNoTimeout && timeout.count() > 0 ? timeout : waitLimit;
  if (limit.count() > 0) {
    if (!doneCv_.wait_for(guard, limit, [&] { return done_; })) {
      guard.unlock();
      if (!cancel || cancel()) {
        TORCH_CHECK(false, "native: ", what, " timed out after ", limit.count() / 1000.0, " s");
      }
      guard.lock();
      doneCv_.wait(guard, [&] { return done_; });  // it arrived while we gave up: use it
    }
  } else {
    doneCv_.wait(guard, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> NativeWork::getFuture() {
  return future_;
}

void NativeWork::markStarted() {
  std::lock_guard<std::mutex> guard(lock_);
  started_ = Clock::now();
}

float NativeWork::getDuration() const {
  std::lock_guard<std::mutex> guard(lock_);
  TORCH_CHECK(timed, "native: ", what, " was not timed: call the group's _enable_collectives_timing() before "
              "issuing the collective");
  TORCH_CHECK(done_, "native: ", what, " has not completed; it has no duration yet");
  // a Work that failed before it ran (a broken group) never started: 0 ms
  const auto start = started_ == Clock::time_point{} ? ended_ : started_;
  return std::chrono::duration<float, std::milli>(ended_ - start).count();
}

}  // namespace native
