#include "actors/op_profile.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "core/text.h"
#include "fmt/format.h"

namespace tessera::actors {

void OpProfile::Add(const std::string& op, const std::string& device, int64_t ns) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[{op, device}];
  if (e.acts == 0) {
    e.op = op;
    e.device = device;
  }
  ++e.acts;
  e.ns += ns;
}

std::vector<OpProfile::Entry> OpProfile::Entries() const {
  std::vector<Entry> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, e] : entries_) out.push_back(e);
  }
  std::stable_sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.ns > b.ns; });
  return out;
}

absl::Status OpProfile::AppendTo(const std::string& path, const std::string& title) const {
  const std::vector<Entry> entries = Entries();
  std::map<std::string, int64_t> device_ns;
  for (const Entry& e : entries) device_ns[e.device] += e.ns;
  std::ofstream out(path, std::ios::app);
  if (!out) return absl::InternalError(StrCat("cannot write the op profile to '", path, "'"));
  out << "# " << title << "\n";
  out << "op\tdevice\tacts\ttotal_ms\tmean_us\tshare\n";
  for (const Entry& e : entries) {
    const int64_t total = device_ns[e.device];
    out << fmt::format("{}\t{}\t{}\t{:.3f}\t{:.1f}\t{:.4f}\n", e.op, e.device, e.acts, static_cast<double>(e.ns) / 1e6,
                       static_cast<double>(e.ns) / 1e3 / static_cast<double>(e.acts),
                       total > 0 ? static_cast<double>(e.ns) / static_cast<double>(total) : 0.0);
  }
  out.flush();
  if (!out) return absl::InternalError(StrCat("writing the op profile to '", path, "' failed"));
  return absl::OkStatus();
}

std::string ProfilePathFromEnvironment() {
  const char* value = std::getenv("TESSERA_PROFILE_OPS");
  return value == nullptr ? std::string() : std::string(value);
}

}  // namespace tessera::actors
