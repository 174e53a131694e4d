// Prometheus text exposition (format 0.0.4) of the engine's metrics, for GET /metrics.
#pragma once

#include <string>

#include "runtime/engine_metrics.h"

namespace spw::server {

std::string render_metrics(const runtime::EngineSnapshot& s);

}  // namespace spw::server
