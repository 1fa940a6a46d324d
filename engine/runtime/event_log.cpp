// Event log.
#include "engine/runtime/event_log.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace hg {

StageWork& StageWork::operator+=(const StageWork& o) {
  flops += o.flops;
  attn_flops += o.attn_flops;
  attn_head_dim = std::max(attn_head_dim, o.attn_head_dim);
  launches += o.launches;
  copy_calls += o.copy_calls;
  elems += o.elems;
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] += o.bytes[i];
    rows[i] += o.rows[i];
  }
  return *this;
}

StageWork StageWork::scaled(double f) const {
  StageWork w = *this;
  w.flops = flops * f;
  w.attn_flops = attn_flops * f;
  w.elems = elems * f;
  w.launches = int64_t(std::lround(double(launches) * f));
  w.copy_calls = int64_t(std::lround(double(copy_calls) * f));
  for (size_t i = 0; i < bytes.size(); ++i) {
    w.bytes[i] = int64_t(double(bytes[i]) * f);
    w.rows[i] = int64_t(double(rows[i]) * f);
  }
  return w;
}

std::string_view stage_kind_name(StageKind k) {
  switch (k) {
    case StageKind::kAccelCompute: return "accel";
    case StageKind::kCpuCompute: return "cpu";
    case StageKind::kTransfer: return "transfer";
  }
  return "?";
}

int64_t EventLog::reserve_id() {
  std::lock_guard<std::mutex> l(mu_);
  return next_id_++;
}

void EventLog::record(StageRecord r) {
  std::lock_guard<std::mutex> l(mu_);
  records_.push_back(std::move(r));
}

std::vector<StageRecord> EventLog::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  auto v = records_;
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return v;
}

void EventLog::clear() {
  std::lock_guard<std::mutex> l(mu_);
  records_.clear();
}

namespace {
// Union of intervals of one kind, sorted and merged.
std::vector<std::pair<double, double>> intervals(const std::vector<StageRecord>& log, StageKind k) {
  std::vector<std::pair<double, double>> v;
  for (auto& r : log)
    if (r.kind == k) v.emplace_back(r.start_s, r.end_s);
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> m;
  for (auto& iv : v) {
    if (!m.empty() && iv.first <= m.back().second) m.back().second = std::max(m.back().second, iv.second);
    else m.push_back(iv);
  }
  return m;
}
}  // namespace

double overlap_seconds(const std::vector<StageRecord>& log, StageKind a, StageKind b) {
  const auto x = intervals(log, a), y = intervals(log, b);
  double total = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const double lo = std::max(x[i].first, y[j].first), hi = std::min(x[i].second, y[j].second);
    if (hi > lo) total += hi - lo;
    (x[i].second < y[j].second) ? ++i : ++j;
  }
  return total;
}

double busy_seconds(const std::vector<StageRecord>& log, StageKind k) {
  double s = 0;
  for (auto& [a, b] : intervals(log, k)) s += b - a;
  return s;
}

PipelineSummary pipeline_summary(const std::vector<StageRecord>& log) {
  std::map<int64_t, std::vector<StageRecord>> by_step;
  for (auto& r : log)
    if (r.step >= 1) by_step[r.step].push_back(r);
  PipelineSummary p;
  double hidden = 0;
  for (auto& [step, recs] : by_step) {
    (void)step;
    ++p.steps;
    const double a = busy_seconds(recs, StageKind::kAccelCompute), c = busy_seconds(recs, StageKind::kCpuCompute),
                 t = busy_seconds(recs, StageKind::kTransfer);
    p.accel_s += a, p.cpu_s += c, p.transfer_s += t, p.serial_s += a + c + t;
    hidden += overlap_seconds(recs, StageKind::kCpuCompute, StageKind::kAccelCompute);
    double lo = recs.front().start_s, hi = recs.front().end_s;
    for (auto& r : recs) lo = std::min(lo, r.start_s), hi = std::max(hi, r.end_s);
    p.critical_s += hi - lo;
  }
  p.hidden_frac = p.cpu_s > 0 ? hidden / p.cpu_s : 0;
  if (p.steps > 0) {
    const double n = p.steps;
    p.accel_s /= n, p.cpu_s /= n, p.transfer_s /= n, p.critical_s /= n, p.serial_s /= n;
  }
  return p;
}

}  // namespace hg
