#include "engine/step_clock.h"

#include <algorithm>
#include <utility>

namespace loom {
namespace {
// Steps whose marks the device has not reached yet; past this the oldest is waited for (a step
// later than that many is long finished in practice: every sampling step waits for its tokens).
constexpr size_t kMaxPending = 64;

void add_to(StepTimes& t, double busy_ms, bool has_gap, double gap_ms) {
  ++t.steps;
  t.busy_ms += busy_ms;
  if (has_gap) {
    ++t.gaps;
    t.gap_ms += gap_ms;
    t.max_gap_ms = std::max(t.max_gap_ms, gap_ms);
  }
}
}  // namespace

void add_step(StepClockTotals& totals, bool decode, double busy_ms, bool has_gap, double gap_ms) {
  add_to(totals.all, busy_ms, has_gap, gap_ms);
  if (decode) add_to(totals.decode, busy_ms, has_gap, gap_ms);
}

void merge(StepClockTotals& totals, const StepClockTotals& more) {
  for (auto [t, m] : {std::pair{&totals.all, &more.all}, std::pair{&totals.decode, &more.decode}}) {
    t->steps += m->steps;
    t->busy_ms += m->busy_ms;
    t->gaps += m->gaps;
    t->gap_ms += m->gap_ms;
    t->max_gap_ms = std::max(t->max_gap_ms, m->max_gap_ms);
  }
}

DeviceStepClock::DeviceStepClock(Device device)
    : device_(device), enabled_(!DeviceEvent(device).empty()) {}

DeviceEvent DeviceStepClock::take_event() {
  if (free_.empty()) return DeviceEvent(device_);
  DeviceEvent e = std::move(free_.back());
  free_.pop_back();
  return e;
}

void DeviceStepClock::begin_step(bool decode, bool follows_previous) {
  if (!enabled_) return;
  // The previous step never marked its end (a failed forward): nothing of it is measured, nor the
  // gap after it.
  if (!pending_.empty() && !pending_.back().ended) {
    Step& s = pending_.back();
    if (s.started) free_.push_back(std::move(s.start));
    pending_.pop_back();
    chain_broken_ = true;
  }
  if (chain_broken_) follows_previous = false;
  chain_broken_ = false;
  resolve(pending_.size() >= kMaxPending);
  Step s;
  s.decode = decode;
  s.follows = follows_previous;
  pending_.push_back(std::move(s));
}

void DeviceStepClock::mark_start(const Exec& ex) {
  if (!enabled_ || pending_.empty()) return;
  Step& s = pending_.back();
  if (s.started || s.ended) return;
  s.start = take_event();
  s.start.record(ex);
  s.started = true;
}

void DeviceStepClock::mark_end(const Exec& ex) {
  if (!enabled_ || pending_.empty()) return;
  Step& s = pending_.back();
  if (s.ended) return;
  if (!s.started) {  // no device work: nothing to measure, and no gap across it
    pending_.pop_back();
    chain_broken_ = true;
    return;
  }
  s.end = take_event();
  s.end.record(ex);
  s.ended = true;
}

void DeviceStepClock::resolve(bool wait_for_oldest) {
  while (!pending_.empty() && pending_.front().ended) {
    Step& s = pending_.front();
    if (wait_for_oldest) {
      s.end.wait();
      wait_for_oldest = false;
    } else if (!s.end.reached()) {
      break;
    }
    const bool has_gap = s.follows && have_last_end_;
    const double gap = has_gap ? elapsed_ms(last_end_, s.start) : 0.0;
    add_step(totals_, s.decode, elapsed_ms(s.start, s.end), has_gap, gap);
    if (have_last_end_) free_.push_back(std::move(last_end_));
    last_end_ = std::move(s.end);
    have_last_end_ = true;
    free_.push_back(std::move(s.start));
    pending_.pop_front();
  }
}

const StepClockTotals& DeviceStepClock::totals(bool settle) {
  if (!enabled_) return totals_;
  if (settle) {
    for (const Step& s : pending_)
      if (s.ended) s.end.wait();
  }
  resolve(false);
  return totals_;
}

}  // namespace loom
