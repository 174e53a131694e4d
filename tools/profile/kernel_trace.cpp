// A kernel-level profiler for any CUDA program, for machines without Nsight Systems (the H200 machine
// has no nsys, and ncu cannot read counters under one of its runtimes; CUPTI's activity API works
// on both). Loaded by the CUDA driver through its injection hook:
//
//   CUDA_INJECTION64_PATH=/path/libspw_kernel_trace.so  SPW_TRACE_OUT=trace.md  program ...
//
// It records every kernel, memcpy and memset with CUPTI and, at exit, writes a summary per profiling
// window: the program marks a window with cudaProfilerStart() / cudaProfilerStop() (spillway bench
// does so around its timed phases, see src/bench). Without a window the whole run is one.
// Per window: wall time between the marks, GPU busy time (the union of the activity intervals),
// the summed kernel time, the gaps, and a table per kernel name (count, total, mean, share). Busy time
// well below the wall time means the GPU waits on the host (launch overhead, synchronisation).
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Interval {
  uint64_t start, end;
  int kind;          // 0 kernel, 1 memcpy, 2 memset
  std::string name;  // kernel name; "memcpy HtoD" etc.
};

struct Window {
  uint64_t start = 0, stop = 0;
};

std::mutex g_mu;
std::vector<Interval> g_records;
std::vector<Window> g_windows;
bool g_window_open = false;

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    default: return "memcpy other";
  }
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<Interval> local;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        local.push_back({k->start, k->end, 0, k->name ? k->name : "?"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        local.push_back({m->start, m->end, 1, copy_kind(m->copyKind)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        local.push_back({m->start, m->end, 2, "memset"});
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_records.insert(g_records.end(), local.begin(), local.end());
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && info->callbackSite == CUPTI_API_EXIT) {
    cuptiActivityFlushAll(0);  // hand the window's records over while the context is certainly alive
    return;
  }
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  std::lock_guard<std::mutex> lock(g_mu);
  if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && info->callbackSite == CUPTI_API_EXIT &&
      !g_window_open) {
    g_windows.push_back({now, 0});
    g_window_open = true;
  } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && info->callbackSite == CUPTI_API_ENTER &&
             g_window_open) {
    g_windows.back().stop = now;
    g_window_open = false;
  }
}

// Kernel names are mangled C++: demangle, drop the parameter list and the namespaces that every
// name shares, keep the template arguments (they tell the instantiations apart).
std::string short_name(const std::string& mangled) {
  int status = 0;
  char* dem = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string s = status == 0 && dem ? dem : mangled;
  std::free(dem);
  // The parameter list starts at the first '(' outside template brackets.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0 && i > 0 && s.compare(i, 21, "(anonymous namespace)") != 0) {
      s.resize(i);
      break;
    }
  }
  for (const char* drop : {"(anonymous namespace)::", "spw::"}) {
    for (size_t at; (at = s.find(drop)) != std::string::npos;) s.erase(at, std::strlen(drop));
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);  // a template's demangled return type
  if (s.size() > 140) s = s.substr(0, 137) + "...";
  for (char& c : s)
    if (c == '|') c = '/';
  return s;
}

void summarize(FILE* out, const Window& w, int index, const std::vector<Interval>& recs) {
  std::vector<const Interval*> in;
  for (const Interval& r : recs)
    if (r.start >= w.start && r.end <= w.stop) in.push_back(&r);
  std::sort(in.begin(), in.end(), [](const Interval* a, const Interval* b) { return a->start < b->start; });
  uint64_t busy = 0, cur_s = 0, cur_e = 0, kernel_sum = 0;
  size_t kernels = 0;
  for (const Interval* r : in) {
    if (r->kind == 0) kernel_sum += r->end - r->start, ++kernels;
    if (r->start > cur_e) {
      busy += cur_e - cur_s;
      cur_s = r->start, cur_e = r->end;
    } else {
      cur_e = std::max(cur_e, r->end);
    }
  }
  busy += cur_e - cur_s;
  const double wall = double(w.stop - w.start);
  std::fprintf(out, "\n## Window %d: %.3f ms wall\n\n", index, wall * 1e-6);
  std::fprintf(out, "GPU busy %.3f ms (%.1f%% of wall); %zu kernels, %.3f ms summed; %zu copies/memsets\n\n",
               busy * 1e-6, wall > 0 ? 100.0 * busy / wall : 0.0, kernels, kernel_sum * 1e-6, in.size() - kernels);
  struct Agg {
    uint64_t total = 0;
    size_t count = 0;
  };
  std::map<std::string, Agg> by_name;
  for (const Interval* r : in) {
    Agg& a = by_name[short_name(r->name)];
    a.total += r->end - r->start, ++a.count;
  }
  std::vector<std::pair<std::string, Agg>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.total > b.second.total; });
  std::fprintf(out, "| kernel / copy | count | total ms | mean us | %% of busy |\n|---|---|---|---|---|\n");
  for (auto& [name, a] : rows)
    std::fprintf(out, "| %s | %zu | %.3f | %.2f | %.1f |\n", name.c_str(), a.count, a.total * 1e-6,
                 a.total * 1e-3 / double(a.count), busy ? 100.0 * a.total / busy : 0.0);
}

void at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  const char* path = std::getenv("SPW_TRACE_OUT");
  FILE* out = path ? std::fopen(path, "w") : stderr;
  if (!out) out = stderr;
  std::vector<Window> windows = g_windows;
  if (g_window_open) windows.back().stop = UINT64_MAX;
  if (windows.empty()) windows.push_back({0, UINT64_MAX});
  std::fprintf(out, "# Kernel trace (tools/profile/kernel_trace.cpp, CUPTI): %zu records, %zu windows\n",
               g_records.size(), windows.size());
  for (size_t i = 0; i < windows.size(); ++i) summarize(out, windows[i], int(i), g_records);
  if (out != stderr) std::fclose(out);
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "spw kernel trace: %s failed: %s\n", what, msg ? msg : "?");
  return false;
}

}  // namespace

// The CUDA driver calls this once when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection(void) {
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register buffers")) return 0;
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
  CUpti_SubscriberHandle sub;
  if (check(cuptiSubscribe(&sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr), "subscribe")) {
    check(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000),
          "profiler start callback");
    check(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000),
          "profiler stop callback");
  }
  std::atexit(at_exit);
  return 1;
}
