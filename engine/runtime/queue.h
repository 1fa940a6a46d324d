// Execution queues with events, like CUDA streams: tasks on one queue run in submission order on
// the queue's own worker thread, each after the events it depends on; submit() returns an Event
// the host or other queues can wait on. Every task is logged as a stage with its work. A task
// that throws fails its event; waiting on it rethrows.
//
// An accelerator-compute task whose body waits for other stages (a strategy waiting for its CPU
// attention, its logits, its KV load) is logged as segments split at those waits: segment k+1
// depends on the stage its wait was for, and the task's work is shared among the segments in
// proportion to their measured time. Stages its body submits record the segment and the moment
// (StageRecord::within, submit_s). So the modeled replay sees the accelerator wait for a CPU stage
// within a step instead of treating the whole forward pass as one stage that overlaps it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/runtime/event_log.h"

namespace hg {

// The step (EventLog::step() at its submission) of the queue task this thread is running, or
// kNoTaskStep outside one.
inline constexpr int64_t kNoTaskStep = INT64_MIN;
int64_t running_task_step();

class Event {
 public:
  Event() = default;
  bool valid() const { return st_ != nullptr; }
  bool done() const;
  void wait() const;  // blocks; rethrows the task's exception
  int64_t stage_id() const { return st_ ? st_->id : -1; }

 private:
  friend class Queue;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    int64_t id = -1;
  };
  std::shared_ptr<State> st_;
};

class Queue {
 public:
  // omp_threads: size of the OpenMP team for kernels this queue's tasks run.
  Queue(std::string name, StageKind kind, int index, EventLog* log, int omp_threads);
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  Event submit(std::string name, StageWork work, std::vector<Event> deps, std::function<void()> fn);
  void synchronize();  // waits for everything submitted so far
  // Called after each wait a task body of this (accelerator) queue makes for another stage (the
  // runtime counts it and spends the device's hand-off cost). Set before the first submit.
  void set_wait_hook(std::function<void()> f) { wait_hook_ = std::move(f); }
  const std::string& name() const { return name_; }
  int index() const { return index_; }
  StageKind kind() const { return kind_; }

 private:
  struct Task {
    std::string name;
    StageWork work;
    std::vector<Event> deps;
    std::function<void()> fn;
    Event ev;
    // The CPU stage whose body submitted this one (-1: none). Logged as a dependency but not
    // waited for: that body is still running and may itself wait for this stage.
    int64_t parent = -1;
    // The accelerator segment whose body submitted this one, and when (StageRecord::within).
    int64_t within = -1;
    double submit_s = 0;
    double submit_progress = -1;  // the submitting segment's reported progress (-1: none)
    // The step the stage was submitted in: it belongs to that step wherever its end falls (a
    // prefetch for the next step may end after the next step began).
    int64_t step = 0;
  };
  void run();
  std::function<void()> wait_hook_;
  std::string name_;
  StageKind kind_;
  int index_;
  EventLog* log_;
  int omp_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread worker_;
  Event last_;
};

// Adds `w` to the work of the accelerator-compute stage whose body the calling thread is running:
// work a strategy does on the accelerator beyond the forward pass the stage was submitted with
// (HybridGen projecting its speculative queries there), so that the modeled clock charges it.
// No effect on any other thread.
void add_accel_work(const StageWork& w);
// Adds device calls (the runtime's meter) to the stage this thread is running, of any queue; none
// outside a stage.
void add_task_calls(int64_t launches, int64_t copy_calls);
// The share (0..1) of its work that the accelerator-compute task the calling thread runs has done,
// reported by a body that knows it (the decoder: per chunk and layer). Once reported, the task's
// segments share its work by progress instead of by measured time, and stages its body submits
// are placed by progress (StageRecord::progress0/1, submit_progress). A task whose progress goes
// back (a body running several forwards) falls back to measured time. No effect on other threads.
void set_accel_progress(double fraction);

// The work of the accelerator-compute task whose body the calling thread is running so far (its
// submitted work plus add_accel_work()); empty on any other thread.
StageWork current_accel_work();

}  // namespace hg
