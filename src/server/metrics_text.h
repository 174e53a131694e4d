// Prometheus text exposition (format 0.0.4) of the scheduler's metrics, for GET /metrics.
#pragma once

#include <string>

#include "runtime/scheduler_metrics.h"

namespace spw::server {

std::string render_metrics(const runtime::SchedulerSnapshot& s);

}  // namespace spw::server
