// Queue worker threads.
#include "engine/runtime/queue.h"

#include <omp.h>

namespace hg {

bool Event::done() const {
  if (!st_) return true;
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->done;
}

void Event::wait() const {
  if (!st_) return;
  std::unique_lock<std::mutex> l(st_->mu);
  st_->cv.wait(l, [&] { return st_->done; });
  if (st_->error) std::rethrow_exception(st_->error);
}

Queue::Queue(std::string name, StageKind kind, int index, EventLog* log, int omp_threads)
    : name_(std::move(name)), kind_(kind), index_(index), log_(log), omp_threads_(std::max(1, omp_threads)) {
  worker_ = std::thread([this] { run(); });
}

Queue::~Queue() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

namespace {
// The id of the CPU-compute stage whose body this thread is running (-1 elsewhere). A CPU stage
// that submits stages from its body hands them its results (HybridGen sends its logits and selected
// V rows once they are computed), so they follow it. The accelerator's decode stage stands for the
// whole forward pass: the stages its strategies submit overlap it, so its body sets no parent.
thread_local int64_t tl_running_stage = -1;
}  // namespace

Event Queue::submit(std::string name, StageWork work, std::vector<Event> deps, std::function<void()> fn) {
  Event ev;
  ev.st_ = std::make_shared<Event::State>();
  ev.st_->id = log_->reserve_id();
  {
    std::lock_guard<std::mutex> l(mu_);
    tasks_.push_back(Task{std::move(name), work, std::move(deps), std::move(fn), ev, tl_running_stage});
    last_ = ev;
  }
  cv_.notify_one();
  return ev;
}

void Queue::synchronize() {
  Event last;
  {
    std::lock_guard<std::mutex> l(mu_);
    last = last_;
  }
  if (last.valid()) {
    std::unique_lock<std::mutex> l(last.st_->mu);
    last.st_->cv.wait(l, [&] { return last.st_->done; });
  }
}

void Queue::run() {
  omp_set_num_threads(omp_threads_);  // per-thread ICV: this queue's kernels use its own team
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      t = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::exception_ptr err;
    StageRecord rec;
    for (auto& d : t.deps) {
      if (!d.valid()) continue;
      rec.deps.push_back(d.stage_id());
      try {
        d.wait();
      } catch (...) {
        err = std::current_exception();  // a failed dependency fails this task too
      }
    }
    if (t.parent >= 0) rec.deps.push_back(t.parent);  // logged for the modeled replay, not waited for
    rec.start_s = log_->now();
    if (!err) {
      tl_running_stage = kind_ == StageKind::kCpuCompute ? t.ev.stage_id() : -1;
      try {
        t.fn();
      } catch (...) {
        err = std::current_exception();
      }
      tl_running_stage = -1;
    }
    rec.end_s = log_->now();
    rec.id = t.ev.stage_id();
    rec.name = std::move(t.name);
    rec.kind = kind_;
    rec.queue = index_;
    rec.step = log_->step();
    rec.work = t.work;
    log_->record(std::move(rec));
    {
      std::lock_guard<std::mutex> l(t.ev.st_->mu);
      t.ev.st_->done = true;
      t.ev.st_->error = err;
    }
    t.ev.st_->cv.notify_all();
  }
}

}  // namespace hg
