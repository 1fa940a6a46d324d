// Queue worker threads.
#include "engine/runtime/queue.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace hg {

bool Event::done() const {
  if (!st_) return true;
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->done;
}

namespace {
// The accelerator-compute task whose body this thread is running, split into segments at the
// stages it waits for (see queue.h).
struct AccelSegments {
  EventLog* log = nullptr;
  struct Segment {
    int64_t id;
    double start_s, end_s;
    int64_t waited_for;  // the stage whose end this segment waited for (-1: the first segment)
    double p0, p1;       // reported progress at its start and end (-1: none)
  };
  std::vector<Segment> done;
  int64_t id = -1;  // the current segment
  double start_s = 0;
  double progress = -1, p0 = -1;  // reported progress now and at the current segment's start
  bool progress_broken = false;    // it went backwards (a body running several forwards): unused
  int64_t waited_for = -1;
  StageWork extra;  // add_accel_work()
  StageWork base;   // the work the task was submitted with
  const std::function<void()>* on_wait = nullptr;  // Queue::set_wait_hook()
};
thread_local AccelSegments* tl_accel = nullptr;
}  // namespace

StageWork current_accel_work() {
  StageWork w;
  if (const AccelSegments* seg = tl_accel) {
    w = seg->base;
    w += seg->extra;
  }
  return w;
}

void set_accel_progress(double fraction) {
  if (AccelSegments* seg = tl_accel) {
    if (seg->p0 < 0) seg->p0 = 0;  // the segment began before the first report: at the start
    if (fraction < seg->progress) seg->progress_broken = true;
    seg->progress = std::clamp(fraction, 0.0, 1.0);
  }
}

void add_accel_work(const StageWork& w) {
  if (AccelSegments* seg = tl_accel) seg->extra += w;
}

void Event::wait() const {
  if (!st_) return;
  AccelSegments* seg = tl_accel;
  if (seg && st_->id >= 0) {  // the current segment ends here; the next begins after the wait
    seg->done.push_back({seg->id, seg->start_s, seg->log->now(), seg->waited_for, seg->p0, seg->progress});
    tl_accel = nullptr;  // waits inside the wait's own machinery do not split again
  }
  {
    std::unique_lock<std::mutex> l(st_->mu);
    st_->cv.wait(l, [&] { return st_->done; });
  }
  if (seg && st_->id >= 0) {
    seg->id = seg->log->reserve_id();  // after the awaited stage's id: the replay runs it after
    seg->start_s = seg->log->now();
    seg->waited_for = st_->id;
    seg->p0 = seg->progress;
    if (seg->on_wait && *seg->on_wait) (*seg->on_wait)();
    tl_accel = seg;
  }
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
// V rows once they are computed), so they follow it. Stages an accelerator stage submits record
// the segment and the moment instead (StageRecord::within).
thread_local int64_t tl_running_stage = -1;
thread_local int64_t tl_task_step = kNoTaskStep;
thread_local StageWork* tl_task_calls = nullptr;  // where the running stage's device calls go
}  // namespace

void add_task_calls(int64_t launches, int64_t copy_calls) {
  if (StageWork* w = tl_task_calls) w->launches += launches, w->copy_calls += copy_calls;
}

int64_t running_task_step() { return tl_task_step; }

Event Queue::submit(std::string name, StageWork work, std::vector<Event> deps, std::function<void()> fn) {
  Event ev;
  ev.st_ = std::make_shared<Event::State>();
  ev.st_->id = log_->reserve_id();
  {
    std::lock_guard<std::mutex> l(mu_);
    tasks_.push_back(Task{std::move(name), work, std::move(deps), std::move(fn), ev, tl_running_stage,
                          tl_accel ? tl_accel->id : -1, tl_accel ? log_->now() : 0.0,
                          tl_accel ? tl_accel->progress : -1.0, log_->step()});
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
    rec.within = t.within;
    rec.submit_s = t.submit_s;
    rec.submit_progress = t.submit_progress;
    rec.start_s = log_->now();
    AccelSegments segments;
    StageWork calls;  // a non-accelerator stage's device calls
    if (!err) {
      tl_running_stage = kind_ == StageKind::kCpuCompute ? t.ev.stage_id() : -1;
      if (kind_ == StageKind::kAccelCompute) {
        segments.log = log_;
        segments.id = t.ev.stage_id();
        segments.start_s = rec.start_s;
        segments.base = t.work;
        segments.on_wait = &wait_hook_;
        tl_accel = &segments;
      }
      tl_task_step = t.step;
      tl_task_calls = kind_ == StageKind::kAccelCompute ? &segments.extra : &calls;
      try {
        t.fn();
      } catch (...) {
        err = std::current_exception();
      }
      tl_task_calls = nullptr;
      tl_task_step = kNoTaskStep;
      tl_running_stage = -1;
      tl_accel = nullptr;
    }
    rec.end_s = log_->now();
    rec.id = t.ev.stage_id();
    rec.name = std::move(t.name);
    rec.kind = kind_;
    rec.queue = index_;
    rec.step = t.step;
    rec.work = t.work;
    rec.work += segments.extra;
    rec.work.launches += calls.launches, rec.work.copy_calls += calls.copy_calls;
    const bool progress = segments.progress >= 0 && !segments.progress_broken;
    if (segments.done.empty()) {
      if (progress) rec.progress0 = 0, rec.progress1 = 1;
      log_->record(std::move(rec));
    } else {
      // Segments: the first keeps the stage's id and dependencies; each later one follows the
      // stage it waited for; the work is shared by reported progress, else by measured time.
      segments.done.push_back({segments.id, segments.start_s, rec.end_s, segments.waited_for, segments.p0, 1.0});
      double busy = 0;
      for (auto& g : segments.done) busy += g.end_s - g.start_s;
      const double n = double(segments.done.size());
      int64_t launches_given = 0, copies_given = 0;
      double share = 0;
      for (size_t k = 0; k < segments.done.size(); ++k) {
        const auto& g = segments.done[k];
        const double f = progress ? std::max(0.0, g.p1 - std::max(0.0, g.p0))
                         : busy > 0 ? (g.end_s - g.start_s) / busy
                                    : 1.0 / n;
        StageRecord part = rec;
        part.id = g.id;
        if (k > 0) {
          part.name += " (part " + std::to_string(k + 1) + ")";
          part.deps = {g.waited_for};
          part.within = -1;
        }
        part.start_s = g.start_s;
        part.end_s = g.end_s;
        if (progress) part.progress0 = std::max(0.0, g.p0), part.progress1 = g.p1;
        part.work = rec.work.scaled(f);
        // Counts split by the running share, rounded, so that the segments add up to the task's.
        share += f;
        const double upto = k + 1 == segments.done.size() ? 1.0 : std::min(1.0, share);
        const int64_t l = std::llround(upto * double(rec.work.launches)), c = std::llround(upto * double(rec.work.copy_calls));
        part.work.launches = l - launches_given, part.work.copy_calls = c - copies_given;
        launches_given = l, copies_given = c;
        log_->record(std::move(part));
      }
    }
    {
      std::lock_guard<std::mutex> l(t.ev.st_->mu);
      t.ev.st_->done = true;
      t.ev.st_->error = err;
    }
    t.ev.st_->cv.notify_all();
  }
}

}  // namespace hg
