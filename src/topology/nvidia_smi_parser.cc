// Parser for `nvidia-smi topo -m` text. Real outputs vary by driver and by how
// they were copied: tabs or aligned spaces, ANSI underline in the header,
// CRLF, NIC columns named NIC# (with a "NIC Legend") or mlx5_#, "CPU Affinity"
// alone or with "NUMA Affinity" and "GPU NUMA ID", rows with extra empty
// fields. The parser keys on tokens, not columns of characters, and checks
// the matrix (square, X on the diagonal, symmetric) so that a damaged paste
// is reported rather than half-read.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <bitset>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "baton/common/file_path.h"
#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

// Devices in one matrix: an 8-GPU node lists 8 to 20; the derived graph
// grows with the cube of the count.
constexpr int kMaxDevices = 256;
// Lines read: a matrix of kMaxDevices, its legends and notes fit many
// times over; 16 MiB of empty lines took 1.4 GB to hold as lines.
constexpr std::size_t kMaxLines = 1 << 16;

constexpr std::string_view kTrailingColumns[] = {"CPU Affinity", "NUMA Affinity", "GPU NUMA ID"};

struct Line {
  int number;  // 1-based, as an editor shows it
  std::string text;
};

std::string strip_ansi_and_cr(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\x1b' && i + 1 < raw.size() && raw[i + 1] == '[') {
      i += 2;
      while (i < raw.size() && !std::isalpha(static_cast<unsigned char>(raw[i]))) ++i;
      continue;  // skips the final letter too
    }
    if (raw[i] != '\r') out.push_back(raw[i]);
  }
  return out;
}

// Lines end with "\n", "\r\n" or a lone "\r" (a file saved by an editor
// that writes classic Mac line ends); a run of "\r" before "\n" is one end.
// At most kMaxLines + 1: one more says the text has too many.
std::vector<Line> split_lines(std::string_view text) {
  std::vector<Line> lines;
  int number = 1;
  std::size_t start = 0;
  while (start <= text.size() && lines.size() <= kMaxLines) {
    const std::size_t end = std::min(text.find_first_of("\r\n", start), text.size());
    lines.push_back({number++, strip_ansi_and_cr(text.substr(start, end - start))});
    if (end == text.size()) break;
    start = end + 1;
    if (text[end] == '\r') {  // "\r\r\n" too: a CRLF file converted twice
      while (start < text.size() && text[start] == '\r') ++start;
      if (start < text.size() && text[start] == '\n') ++start;
    }
  }
  return lines;
}

std::vector<std::string> tokens_of(std::string_view s) {
  std::vector<std::string> out;
  std::istringstream in{std::string(s)};
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

// The values after a row's first `skip` tokens (its name and matrix
// cells). Where they are tab-separated, an empty field is a value of its
// own: nvidia-smi leaves CPU Affinity empty for a GPU whose CPUs a
// container or a job's CPU set hides, and read as tokens the values after
// it slid one column left (NUMA node 1 taken for the CPU list "1"). It
// writes two tabs before an N/A, so an empty field just before one is
// padding. A field holding spaces between values is not tab-separated
// text: read as tokens.
std::vector<std::string> values_after(std::string_view line, std::size_t skip) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::size_t at = 0;
  for (std::size_t k = 0; k < skip; ++k) {
    while (at < line.size() && space(line[at])) ++at;
    while (at < line.size() && !space(line[at])) ++at;
  }
  const std::string_view rest = line.substr(at);
  const std::size_t first_tab = rest.find('\t');
  // Before the first tab only the separator's spaces: else the values are
  // space-separated (a row that merely ends in a tab).
  if (first_tab == std::string_view::npos || !std::ranges::all_of(rest.substr(0, first_tab), space)) {
    return tokens_of(rest);
  }
  std::vector<std::string> fields;
  for (std::size_t from = first_tab + 1;;) {
    const std::size_t end = std::min(rest.find('\t', from), rest.size());
    std::string_view field = rest.substr(from, end - from);
    while (!field.empty() && space(field.front())) field.remove_prefix(1);
    while (!field.empty() && space(field.back())) field.remove_suffix(1);
    if (std::ranges::any_of(field, space)) return tokens_of(rest);
    fields.emplace_back(field);
    if (end == rest.size()) break;
    from = end + 1;
  }
  while (!fields.empty() && fields.back().empty()) fields.pop_back();
  std::vector<std::string> values;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].empty() && i + 1 < fields.size() && fields[i + 1] == "N/A") continue;
    values.push_back(std::move(fields[i]));
  }
  return values;
}

// An affinity value that says nothing: N/A, or an empty tab-separated field.
bool unknown_value(std::string_view v) { return v.empty() || v == "N/A"; }

bool is_blank(std::string_view s) {
  return std::ranges::all_of(s, [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

std::optional<int> parse_int(std::string_view s) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// "GPU3" → 3.
std::optional<int> gpu_index(std::string_view name) {
  if (name.size() < 4 || name.substr(0, 3) != "GPU") return std::nullopt;
  return parse_int(name.substr(3));
}

using CpuSet = std::bitset<kMaxCpu + 1>;

// The CPUs of a list such as "0-63,128-191"; nullopt if not a list of CPUs
// 0..kMaxCpu.
std::optional<CpuSet> cpu_set(std::string_view list) {
  CpuSet cpus;
  std::istringstream in{std::string(list)};
  for (std::string part; std::getline(in, part, ',');) {
    const auto dash = part.find('-');
    const auto lo = parse_int(std::string_view(part).substr(0, dash));
    const auto hi = dash == std::string::npos ? lo : parse_int(std::string_view(part).substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > kMaxCpu) return std::nullopt;
    for (int cpu = *lo; cpu <= *hi; ++cpu) cpus.set(static_cast<std::size_t>(cpu));
  }
  return cpus.none() ? std::nullopt : std::optional(cpus);
}

// Number of distinct CPUs in a list (a CPU listed twice counts once; a sum
// wrapped past INT_MAX); nullopt if not a list of CPUs.
std::optional<int> cpu_list_count(std::string_view list) {
  const auto cpus = cpu_set(list);
  return cpus ? std::optional(static_cast<int>(cpus->count())) : std::nullopt;
}

// "0-15,32-47": a set as nvidia-smi and the kernel write it.
std::string cpu_list(const CpuSet& cpus) {
  std::string out;
  for (std::size_t cpu = 0; cpu < cpus.size(); ++cpu) {
    if (!cpus[cpu]) continue;
    std::size_t last = cpu;
    while (last + 1 < cpus.size() && cpus[last + 1]) ++last;
    out += fmt::format("{}{}", out.empty() ? "" : ",", cpu == last ? fmt::format("{}", cpu) : fmt::format("{}-{}", cpu, last));
    cpu = last;
  }
  return out;
}

struct Cell {
  bool self = false;
  PciLocality pci = PciLocality::kUnknown;
  int nvlinks = 0;
  friend bool operator==(const Cell&, const Cell&) = default;
};

std::optional<Cell> parse_cell(std::string_view t) {
  if (t == "X") return Cell{true, PciLocality::kUnknown, 0};
  if (t == "PIX") return Cell{false, PciLocality::kPix, 0};
  if (t == "PXB") return Cell{false, PciLocality::kPxb, 0};
  if (t == "PHB") return Cell{false, PciLocality::kPhb, 0};
  if (t == "NODE") return Cell{false, PciLocality::kNode, 0};
  // Drivers before NODE existed called the socket link SOC.
  if (t == "SYS" || t == "SOC") return Cell{false, PciLocality::kSys, 0};
  if (t.size() > 2 && t.substr(0, 2) == "NV") {
    // More bonded links than a GPU has ports is not a machine.
    if (auto n = parse_int(t.substr(2)); n && *n > 0 && *n <= kMaxNvlinksPerGpu) {
      return Cell{false, PciLocality::kUnknown, *n};
    }
  }
  return std::nullopt;
}

constexpr std::size_t kLongestNicName = 255;

// A device name as a driver writes one (mlx5_0, GPU3, eth1): printable
// ASCII. A name from a file is printed to a terminal, where an escape
// sequence in it would act (retitle the window, reorder the text).
bool is_device_name(std::string_view name) {
  return !name.empty() && name.size() <= kLongestNicName &&
         std::ranges::all_of(name, [](char c) { return c > ' ' && c < '\x7f'; });
}

// "  NIC0: mlx5_0" → {"0", "mlx5_0"}; any other line → nullopt. By hand:
// std::regex recursed once per character and overflowed the stack on a
// line of some 26 000 spaces.
std::optional<std::pair<std::string_view, std::string_view>> nic_legend(std::string_view line) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  auto skip_spaces = [&] {
    while (!line.empty() && space(line.front())) line.remove_prefix(1);
  };
  skip_spaces();
  if (!line.starts_with("NIC")) return std::nullopt;
  line.remove_prefix(3);
  std::size_t digits = 0;
  while (digits < line.size() && std::isdigit(static_cast<unsigned char>(line[digits])) != 0) ++digits;
  if (digits == 0) return std::nullopt;
  const std::string_view index = line.substr(0, digits);
  line.remove_prefix(digits);
  skip_spaces();
  if (!line.starts_with(':')) return std::nullopt;
  line.remove_prefix(1);
  skip_spaces();
  std::size_t name = 0;
  while (name < line.size() && !space(line[name])) ++name;
  if (name == 0) return std::nullopt;
  const std::string_view nic = line.substr(0, name);
  line.remove_prefix(name);
  skip_spaces();
  if (!line.empty()) return std::nullopt;
  return std::pair{index, nic};
}

}  // namespace

Result<TopologyFacts> parse_nvidia_smi_topo(std::string_view text) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 BOM, as Windows editors save
  if (text.starts_with("\xFF\xFE") || text.starts_with("\xFE\xFF")) {
    return std::unexpected(Status::invalid_argument(
        "nvidia-smi topo: the text is UTF-16 (a byte order mark {}): save it as UTF-8 or ASCII",
        text.starts_with("\xFF\xFE") ? "FF FE" : "FE FF"));
  }
  // Non-breaking spaces (U+00A0, two bytes), as text copied from a web page
  // has them between the columns: read as two spaces, which keeps offsets.
  std::string respaced;
  if (text.find("\xC2\xA0") != std::string_view::npos) {
    respaced = std::string(text);
    for (std::size_t at = respaced.find("\xC2\xA0"); at != std::string::npos; at = respaced.find("\xC2\xA0", at)) {
      respaced.replace(at, 2, "  ");
    }
    text = respaced;
  }
  const std::vector<Line> lines = split_lines(text);
  auto error = [](int line, std::string why) {
    return std::unexpected(Status::invalid_argument("nvidia-smi topo: line {}: {}", line, why));
  };
  if (lines.size() > kMaxLines) {
    return std::unexpected(Status::invalid_argument(
        "nvidia-smi topo: more than {} lines: not the output of nvidia-smi topo -m", kMaxLines));
  }

  std::size_t at = 0;
  while (at < lines.size() && is_blank(lines[at].text)) ++at;
  if (at == lines.size()) {
    return std::unexpected(Status::invalid_argument("nvidia-smi topo: the text is empty"));
  }
  // Lines before the header (a shell prompt, the "NVIDIA Topology:" title
  // of sglang's check_env, a log's prefix) are skipped with a note; text
  // without a header is refused at its first line.
  const std::size_t first = at;
  auto starts_header = [](std::string_view text) {
    const auto from = text.find_first_not_of(" \t");
    return from != std::string_view::npos && text.substr(from).starts_with("GPU0") &&
           (text.size() == from + 4 || std::isspace(static_cast<unsigned char>(text[from + 4])) != 0);
  };
  while (at < lines.size() && !starts_header(lines[at].text)) ++at;
  if (at == lines.size()) at = first;
  const std::size_t skipped = at - first;

  // Header: device columns, then the trailing affinity columns.
  const Line& header = lines[at++];
  std::size_t devices_end = header.text.size();
  std::vector<std::pair<std::size_t, std::string_view>> trailing;
  for (std::string_view name : kTrailingColumns) {
    if (const auto pos = header.text.find(name); pos != std::string::npos) {
      trailing.emplace_back(pos, name);
      devices_end = std::min(devices_end, pos);
    }
  }
  std::ranges::sort(trailing);
  const std::vector<std::string> columns = tokens_of(std::string_view(header.text).substr(0, devices_end));
  if (columns.empty() || columns.front() != "GPU0") {
    return error(header.number,
                 fmt::format("expected the matrix header \"GPU0 GPU1 … CPU Affinity …\", found \"{}\"",
                             shown(header.text)));
  }
  const int n = static_cast<int>(columns.size());
  if (n > kMaxDevices) {
    return error(header.number, fmt::format("{} devices in the matrix (at most {})", n, kMaxDevices));
  }
  std::vector<int> gpu_of(n, -1);  // column → GPU index, or -1 for a NIC
  std::vector<int> nic_of(n, -1);
  int gpus = 0;
  int nics = 0;
  for (int c = 0; c < n; ++c) {
    if (!is_device_name(columns[c])) {
      return error(header.number, fmt::format("column \"{}\" is not a device name (at most {} printable ASCII "
                                              "characters)", shown(columns[c]), kLongestNicName));
    }
    if (std::count(columns.begin(), columns.end(), columns[c]) > 1) {
      return error(header.number, fmt::format("column \"{}\" appears twice", columns[c]));
    }
    if (auto g = gpu_index(columns[c])) {
      if (*g != gpus) {
        return error(header.number, fmt::format("column \"{}\" where GPU{} was expected", columns[c], gpus));
      }
      gpu_of[c] = gpus++;
    } else {
      nic_of[c] = nics++;
    }
  }

  // Matrix rows, one per column, in the same order.
  std::vector<std::vector<Cell>> cells(n);
  std::vector<std::map<std::string_view, std::string>> extras(n);
  std::vector<int> row_line(n);
  for (int r = 0; r < n; ++r, ++at) {
    if (at == lines.size() || is_blank(lines[at].text)) {
      const int where = at == lines.size() ? lines.back().number : lines[at].number;
      return error(where, fmt::format("the matrix ends after {} rows but the header has {} columns", r, n));
    }
    const Line& line = lines[at];
    row_line[r] = line.number;
    const std::vector<std::string> t = tokens_of(line.text);
    if (t.front() != columns[r]) {
      return error(line.number, fmt::format("expected the row of \"{}\", found \"{}\"", columns[r], shown(t.front())));
    }
    if (static_cast<int>(t.size()) < n + 1) {
      return error(line.number, fmt::format("row \"{}\" has {} cells, expected {}", columns[r], t.size() - 1, n));
    }
    for (int c = 0; c < n; ++c) {
      const auto cell = parse_cell(t[c + 1]);
      if (!cell) {
        return error(line.number,
                     fmt::format("{}-{}: unknown value \"{}\" (expected X, SYS, NODE, PHB, PXB, PIX or NV1..NV18)",
                                 columns[r], columns[c], shown(t[c + 1])));
      }
      if (cell->self != (r == c)) {
        return error(line.number, fmt::format("{}-{}: \"{}\" {}", columns[r], columns[c], t[c + 1],
                                              r == c ? "on the diagonal must be X" : "X off the diagonal"));
      }
      if (cell->nvlinks > 0 && (gpu_of[r] < 0 || gpu_of[c] < 0)) {
        return error(line.number, fmt::format("{}-{}: \"{}\" but NVLink joins GPUs only; {} is a NIC", columns[r],
                                              columns[c], t[c + 1], columns[gpu_of[r] < 0 ? r : c]));
      }
      cells[r].push_back(*cell);
    }
    std::vector<std::string> values = values_after(line.text, static_cast<std::size_t>(n) + 1);
    if (gpu_of[r] < 0 && !values.empty()) {  // nvidia-smi gives affinities for GPUs only
      return error(line.number, fmt::format("row \"{}\" is a NIC's but has {} values after the matrix (\"{}\"): "
                                            "a NIC row ends with its matrix cells",
                                            columns[r], values.size(), shown(values.front())));
    }
    if (values.size() > trailing.size()) {
      return error(line.number, fmt::format("row \"{}\" has {} values after the matrix, the header names {}",
                                            columns[r], values.size(), trailing.size()));
    }
    for (std::size_t k = 0; k < values.size(); ++k) extras[r][trailing[k].second] = std::move(values[k]);
  }
  for (int r = 0; r < n; ++r) {
    for (int c = r + 1; c < n; ++c) {
      if (!(cells[r][c] == cells[c][r])) {
        return error(row_line[c], fmt::format("{}-{} differs from {}-{}: the matrix is not symmetric",
                                              columns[c], columns[r], columns[r], columns[c]));
      }
    }
  }

  // After the matrix: only the legends matter ("  NIC0: mlx5_0"), one per
  // NIC column, each naming a different device.
  std::map<int, std::string> nic_names;
  std::map<std::string, int, std::less<>> nic_by_name;
  for (; at < lines.size(); ++at) {
    // A second matrix (two outputs pasted together), or a row the header
    // does not name, would be dropped without a word: refused.
    if (const std::vector<std::string> t = tokens_of(lines[at].text);
        t.size() >= 2 && (gpu_index(t[0]) || std::ranges::find(columns, t[0]) != columns.end() ||
                          (t[0].starts_with("NIC") && parse_int(std::string_view(t[0]).substr(3)))) &&
        (parse_cell(t[1]) || gpu_index(t[1]))) {
      return error(lines[at].number, fmt::format("\"{}\" after the matrix ended (its header names {} devices, "
                                                 "GPU0 .. {}): one matrix per file",
                                                 shown(fmt::format("{}", fmt::join(t, " "))), n, columns.back()));
    }
    const auto legend = nic_legend(lines[at].text);
    if (!legend) continue;
    // The digits may not fit an int (std::stoi would throw): refuse, never abort.
    int index = 0;
    const std::string_view digits = legend->first;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec != std::errc() || end != digits.data() + digits.size()) {
      return error(lines[at].number, fmt::format("NIC legend index \"{}\" is out of range", shown(digits)));
    }
    if (legend->second.size() > kLongestNicName) {  // an interface name is at most 15, an RDMA device's 63
      return error(lines[at].number, fmt::format("NIC{} legend name of {} bytes (at most {}): \"{}\"", index,
                                                 legend->second.size(), kLongestNicName, shown(legend->second)));
    }
    if (!is_device_name(legend->second)) {
      return error(lines[at].number, fmt::format("NIC{} legend name \"{}\" is not a device name (printable "
                                                 "ASCII only)", index, shown(legend->second)));
    }
    if (std::ranges::find(columns, fmt::format("NIC{}", index)) == columns.end()) {
      return error(lines[at].number, fmt::format("legend for NIC{}, which is not a column of the matrix", index));
    }
    if (const auto named = nic_names.find(index); named != nic_names.end()) {
      return error(lines[at].number, fmt::format("NIC{} named twice (\"{}\", then \"{}\")", index,
                                                 shown(named->second), shown(legend->second)));
    }
    if (const auto other = nic_by_name.find(legend->second); other != nic_by_name.end()) {
      return error(lines[at].number, fmt::format("NIC{} and NIC{} both named \"{}\"", other->second, index,
                                                 shown(legend->second)));
    }
    nic_names[index] = std::string(legend->second);
    nic_by_name.emplace(legend->second, index);
  }

  TopologyFacts facts;
  facts.source = "nvidia-smi";
  if (skipped > 0) {
    facts.notes.push_back(fmt::format("nvidia-smi: {} line{} before the matrix header skipped (line {}: \"{}\")",
                                      skipped, skipped == 1 ? "" : "s", lines[first].number,
                                      shown(lines[first].text)));
  }
  facts.gpus.resize(gpus);
  facts.nics.resize(nics);
  const bool numa_column = std::ranges::any_of(trailing, [](const auto& t) { return t.second == "NUMA Affinity"; });
  // NIC columns a legend that names others leaves out: their column name
  // is no device (--nics auto would pass it to UCX), so it is noted.
  std::vector<std::string> unnamed_nics;
  // GPUs whose NUMA Affinity names no one node: N/A, or a list of nodes
  // ("0-1", where the firmware left the PCI device's node unset).
  std::vector<std::string> numa_unknown;
  for (int c = 0; c < n; ++c) {
    if (gpu_of[c] >= 0) {
      GpuInfo& gpu = facts.gpus[gpu_of[c]];
      gpu.name = columns[c];
      const auto& ex = extras[c];
      if (auto it = ex.find("CPU Affinity"); it != ex.end() && !unknown_value(it->second)) {
        if (!cpu_list_count(it->second)) {
          return error(row_line[c], fmt::format("{}: CPU Affinity \"{}\" is not a CPU list (0-31,64-95) of CPUs "
                                                "0..{}", columns[c], shown(it->second), kMaxCpu));
        }
        gpu.cpu_affinity = it->second;
      }
      // A NUMA node the kernel could have (0..1023), or N/A: a value beyond
      // was dropped or taken as node -5.
      auto numa_value = [&](const char* column, auto& into) -> Status {
        const auto it = ex.find(column);
        if (it == ex.end() || unknown_value(it->second)) return Status::ok();
        const auto v = parse_int(it->second);
        if (!v || *v < 0 || *v > kMaxNumaNode) {
          return Status::invalid_argument("nvidia-smi topo: line {}: {}: {} \"{}\" (expected 0..{}, a list of "
                                          "nodes or N/A)",
                                          row_line[c], columns[c], column, shown(it->second), kMaxNumaNode);
        }
        into = *v;
        return Status::ok();
      };
      if (numa_column) {
        const auto it = ex.find("NUMA Affinity");
        if (it == ex.end()) {
          // Guessed from the CPU set instead, its id collided with given ones.
          return error(row_line[c], fmt::format("row \"{}\" has no NUMA Affinity value (the header names one; "
                                                "N/A when unknown)", columns[c]));
        }
        const bool node_list = it->second.find_first_of(",-") != std::string_view::npos && cpu_list_count(it->second);
        if (unknown_value(it->second) || node_list) {
          numa_unknown.push_back(fmt::format("{} \"{}\"", columns[c], shown(it->second)));
        } else if (Status st = numa_value("NUMA Affinity", gpu.numa); !st.is_ok()) {
          return std::unexpected(st);
        }
      }
      if (Status st = numa_value("GPU NUMA ID", gpu.gpu_numa_id); !st.is_ok()) return std::unexpected(st);
    } else {
      const int k = nic_of[c];
      NicInfo& nic = facts.nics[k];
      nic.kind = NicKind::kRdma;  // nvidia-smi lists RDMA devices only
      nic.name = columns[c];
      if (columns[c].starts_with("NIC")) {
        if (auto idx = parse_int(std::string_view(columns[c]).substr(3)); idx && nic_names.contains(*idx)) {
          nic.name = nic_names[*idx];
        } else if (!nic_names.empty()) {
          unnamed_nics.push_back(columns[c]);
        }
      }
    }
  }
  if (!unnamed_nics.empty()) {
    facts.notes.push_back(fmt::format("nvidia-smi: the NIC Legend names no device for {}: known by that column "
                                      "name only, which is no device to open",
                                      fmt::join(unnamed_nics, ", ")));
  }
  // No GPU names its node (older drivers print no NUMA Affinity; VMs and
  // some firmware print N/A or a list): GPUs with the same CPU set share a
  // socket, numbered in order of appearance. Where some GPUs name theirs,
  // a guessed id could collide with a given one: the others stay unknown.
  const bool none_given = std::ranges::none_of(facts.gpus, [](const GpuInfo& g) { return g.numa != kUnknownNuma; });
  std::map<std::string, int> numa_by_cpus;
  if (none_given) {
    for (GpuInfo& gpu : facts.gpus) {
      if (gpu.cpu_affinity.empty()) continue;
      gpu.numa = numa_by_cpus.try_emplace(gpu.cpu_affinity, static_cast<int>(numa_by_cpus.size())).first->second;
    }
  }
  // A CPU set is no socket where the matrix puts two GPUs that share it on
  // different sockets (a job's or container's CPU set spanning both): SYS
  // between them, or a NIC near one and SYS to the other. Those GPUs' node
  // stays unknown, and their CPU set a node of host memory that they reach
  // as remote (numa_nodes_complete is false for this source).
  std::set<int> crossed;
  std::string crossing;  // the first, for the note
  for (int r = 0; r < n && !numa_by_cpus.empty(); ++r) {
    for (int c = r + 1; c < n && gpu_of[r] >= 0; ++c) {
      const int node = facts.gpus[gpu_of[r]].numa;
      if (gpu_of[c] < 0 || node == kUnknownNuma || facts.gpus[gpu_of[c]].numa != node) continue;
      auto sys = [&](int a, int b) { return cells[a][b].pci == PciLocality::kSys; };
      auto near = [&](int a, int b) { return !sys(a, b) && cells[a][b].pci != PciLocality::kUnknown; };
      std::string how = sys(r, c) ? "SYS between them" : "";
      for (int k = 0; k < n && how.empty(); ++k) {
        if (gpu_of[k] < 0 && ((near(k, r) && sys(k, c)) || (sys(k, r) && near(k, c)))) {
          how = fmt::format("{} is SYS to one of them only", columns[k]);
        }
      }
      if (how.empty()) continue;
      crossed.insert(node);
      if (crossing.empty()) {
        crossing = fmt::format("{} and {} share CPU Affinity \"{}\" but the matrix puts them on different sockets "
                               "({})", columns[r], columns[c], shown(facts.gpus[gpu_of[r]].cpu_affinity), how);
      }
    }
  }
  for (GpuInfo& gpu : facts.gpus) {
    if (crossed.contains(gpu.numa)) gpu.numa = kUnknownNuma;
  }
  const bool numa_inferred = crossed.size() < numa_by_cpus.size();
  const std::string why = !numa_column ? std::string("no NUMA Affinity column")
                                       : fmt::format("NUMA Affinity of {}", fmt::join(numa_unknown, ", "));
  if (!crossing.empty()) {
    facts.notes.push_back(fmt::format("nvidia-smi: {}; {}: the node of the GPUs with that CPU set is unknown{}",
                                      why, crossing, numa_inferred ? ", the others' inferred from CPU Affinity" : ""));
  } else if (numa_inferred) {
    facts.notes.push_back(fmt::format("nvidia-smi: {}; NUMA nodes inferred from CPU Affinity", why));
  } else if (none_given && gpus > 0) {
    facts.notes.push_back(
        fmt::format("nvidia-smi: {} and no CPU Affinity: no NUMA node known, so no host-memory paths", why));
  } else if (!numa_unknown.empty()) {
    facts.notes.push_back(fmt::format("nvidia-smi: {}: their NUMA node unknown", why));
  }
  // NUMA nodes the file gives that its matrix contradicts: two GPUs on one
  // socket's PCIe (PIX, PXB, PHB, NODE) on different nodes, or SYS between
  // two on the same node. Each is used as written (a VM may show either
  // wrong), with a note.
  auto disagreement = [&]() -> std::string {
    for (int r = 0; r < n && !none_given; ++r) {
      for (int c = r + 1; c < n && gpu_of[r] >= 0; ++c) {
        if (gpu_of[c] < 0) continue;
        const int a = facts.gpus[gpu_of[r]].numa;
        const int b = facts.gpus[gpu_of[c]].numa;
        const PciLocality pci = cells[r][c].pci;
        if (a == kUnknownNuma || b == kUnknownNuma || pci == PciLocality::kUnknown ||
            (pci == PciLocality::kSys) != (a == b)) {
          continue;
        }
        return fmt::format("nvidia-smi: {}-{} is {} but their NUMA Affinity is {} and {}: the matrix and the NUMA "
                           "nodes disagree (each used as written)",
                           columns[r], columns[c], to_string(pci), a, b);
      }
    }
    return {};
  };
  if (std::string note = disagreement(); !note.empty()) facts.notes.push_back(std::move(note));

  for (int r = 0; r < n; ++r) {
    for (int c = r + 1; c < n; ++c) {
      const Cell& cell = cells[r][c];
      auto ref = [&](int col) {
        return gpu_of[col] >= 0 ? DeviceRef{DeviceRef::Kind::kGpu, gpu_of[col]}
                                : DeviceRef{DeviceRef::Kind::kNic, nic_of[col]};
      };
      facts.relations.push_back({ref(r), ref(c), cell.pci, cell.nvlinks, false, false});
    }
  }

  // NVSwitch: a GPU bonded to its peers by more links than it has. All of
  // its links to one peer (NV18) is either a bridged pair (H200 NVL) or two
  // GPUs of an NVSwitch machine (a container given two): a bond, noted.
  std::vector<int> nvlink_sum(gpus, 0);
  for (const Relation& rel : facts.relations) {
    if (rel.nvlinks > 0) {
      nvlink_sum[rel.a.index] += rel.nvlinks;
      nvlink_sum[rel.b.index] += rel.nvlinks;
    }
  }
  for (Relation& rel : facts.relations) {
    if (rel.nvlinks > 0 &&
        (nvlink_sum[rel.a.index] > kMaxNvlinksPerGpu || nvlink_sum[rel.b.index] > kMaxNvlinksPerGpu)) {
      rel.via_nvswitch = true;
    }
  }
  if (const auto all = std::ranges::find_if(
          facts.relations, [](const Relation& r) { return r.nvlinks == kMaxNvlinksPerGpu && !r.via_nvswitch; });
      all != facts.relations.end()) {
    facts.notes.push_back(fmt::format("nvidia-smi: {}-{} is NV{}, every link of each to the other: a bridged pair "
                                      "(H200 NVL) or two GPUs of an NVSwitch machine; taken as a bond (nvlink; a "
                                      "policy's cost_model prices it)",
                                      facts.gpus[all->a.index].name, facts.gpus[all->b.index].name, all->nvlinks));
  }
  // Active links: on a fabric every NV# is the GPU's own link count to the
  // switches; with direct links the bonds to each peer add up.
  for (int g = 0; g < gpus; ++g) {
    int fabric = 0;
    for (const Relation& rel : facts.relations) {
      if (rel.via_nvswitch && (rel.a.index == g || rel.b.index == g)) fabric = std::max(fabric, rel.nvlinks);
    }
    facts.gpus[g].nvlink_active = fabric > 0 ? fabric : nvlink_sum[g];
  }
  // On a fabric a pair's NV# is the fewer links of its two GPUs; one below
  // that (NV2 beside NV18 both ways) is no machine nvidia-smi describes,
  // priced as written, with a note.
  auto fewer_links = [&](const Relation& r) {
    return std::min(facts.gpus[r.a.index].nvlink_active, facts.gpus[r.b.index].nvlink_active);
  };
  if (const auto below = std::ranges::find_if(
          facts.relations, [&](const Relation& r) { return r.via_nvswitch && r.nvlinks != fewer_links(r); });
      below != facts.relations.end()) {
    facts.notes.push_back(fmt::format("nvidia-smi: {}-{} is NV{} on an NVSwitch fabric where both show NV{} to other "
                                      "peers: priced as NV{}",
                                      facts.gpus[below->a.index].name, facts.gpus[below->b.index].name,
                                      below->nvlinks, fewer_links(*below), below->nvlinks));
  }

  // A NIC sits on the NUMA node of any GPU it reaches without the socket
  // link; GPUs on different nodes that say so leave it unknown, whatever
  // their order.
  std::vector<bool> numa_conflict(nics, false);
  for (const Relation& rel : facts.relations) {
    if (rel.a.kind != DeviceRef::Kind::kGpu || rel.b.kind != DeviceRef::Kind::kNic) continue;
    if (rel.pci == PciLocality::kSys || rel.pci == PciLocality::kUnknown) continue;
    NicInfo& nic = facts.nics[rel.b.index];
    const int numa = facts.gpus[rel.a.index].numa;
    if (numa == kUnknownNuma || numa_conflict[rel.b.index]) continue;
    if (nic.numa != kUnknownNuma && nic.numa != numa) {
      numa_conflict[rel.b.index] = true;
      nic.numa = kUnknownNuma;
      continue;
    }
    nic.numa = numa;
  }

  // NUMA nodes named by the GPUs, with the CPU set the matrix gives for
  // them, and the CPU sets no GPU could be placed on. Only those: the
  // machine may have more.
  // GPUs of one node that name different CPU sets (a container's cgroup
  // cut differently per GPU, or a hand-edited file) give the node their
  // union, with a note: the first set alone would hide CPUs of that node.
  std::map<int, NumaInfo> numa;
  std::map<int, std::vector<std::string>> sets;  // per node, each distinct CPU set given
  std::map<int, CpuSet> union_of;
  for (const GpuInfo& gpu : facts.gpus) {
    if (gpu.numa == kUnknownNuma) continue;
    auto& given = sets[gpu.numa];
    if (auto cpus = cpu_set(gpu.cpu_affinity)) {  // empty: not given
      if (std::ranges::find(given, gpu.cpu_affinity) == given.end()) given.push_back(gpu.cpu_affinity);
      union_of[gpu.numa] |= *cpus;
    }
    if (!numa.contains(gpu.numa)) {
      numa[gpu.numa] = {gpu.numa, gpu.cpu_affinity, cpu_list_count(gpu.cpu_affinity).value_or(0), 0};
    }
  }
  for (const auto& [id, given] : sets) {
    const auto cpus = union_of.find(id);
    if (cpus == union_of.end() || (given.size() < 2 && !numa[id].cpus.empty())) continue;
    numa[id].cpus = cpu_list(cpus->second);  // a first GPU with no set leaves the node the others'
    numa[id].cpu_count = static_cast<int>(cpus->second.count());
    if (given.size() < 2) continue;
    facts.notes.push_back(fmt::format("nvidia-smi: the GPUs of NUMA node {} give different CPU Affinity ({}): the "
                                      "node takes them all ({})",
                                      id, fmt::join(given, " / "), numa[id].cpus));
  }
  for (const auto& [cpus, id] : numa_by_cpus) {
    if (crossed.contains(id)) numa[id] = {id, cpus, cpu_list_count(cpus).value_or(0), 0};
  }
  for (auto& [id, info] : numa) facts.numa_nodes.push_back(info);
  facts.numa_nodes_complete = false;
  return facts;
}

Result<TopologyFacts> load_nvidia_smi_topo(const std::string& path) {
  // A file, a pipe (`<(nvidia-smi topo -m)`), or "-" for standard input
  // (`nvidia-smi topo -m | baton topo --nvidia-smi -`); bounded, so that a
  // device that never ends (/dev/zero) is refused rather than read forever.
  // 256 devices' matrix is well under 1 MiB.
  constexpr std::size_t kMostBytes = 16 << 20;
  if (Status s = check_file_path("nvidia-smi topo", path); !s.is_ok()) return std::unexpected(s);
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !(std::filesystem::is_regular_file(status) || std::filesystem::is_fifo(status))) {
      return std::unexpected(Status::not_found("nvidia-smi topo: \"{}\" is not a readable file or pipe", path));
    }
    errno = 0;
    file.open(path, std::ios::binary);
    if (!file) {
      const int why = errno;
      return std::unexpected(Status(why == EACCES || why == EPERM ? StatusCode::kPermissionDenied : StatusCode::kNotFound,
                                    fmt::format("nvidia-smi topo: cannot open \"{}\": {}", path, std::strerror(why))));
    }
    in = &file;
  }
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= kMostBytes && in->read(chunk, sizeof chunk).gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(in->gcount()));
  }
  if (in->bad()) return std::unexpected(Status::unavailable("nvidia-smi topo: cannot read \"{}\"", path));
  if (text.size() > kMostBytes) {
    return std::unexpected(Status::invalid_argument(
        "nvidia-smi topo: \"{}\" holds more than {} MiB: not the output of nvidia-smi topo -m", path, kMostBytes >> 20));
  }
  auto facts = parse_nvidia_smi_topo(text);
  if (!facts) {
    return std::unexpected(Status(facts.error().code(), fmt::format("{}: {}", path, facts.error().message())));
  }
  facts->source = fmt::format("nvidia-smi:{}", path);
  return facts;
}

}  // namespace baton::topology
