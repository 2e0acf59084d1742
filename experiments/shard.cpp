// --shard and `kdalab merge` (experiments/shard.hpp; docs/cluster.md).
#include "experiments/shard.hpp"

#include <H5Cpp.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "experiments/cli.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

ShardSpec parse_shard(const std::string& value, bool given) {
  ShardSpec s;
  if (value.empty() && !given) return s;
  static const std::regex re("([1-9][0-9]{0,5})/([1-9][0-9]{0,5})");
  std::smatch m;
  const std::string accepted = "; give I/N with integers 1 <= I <= N <= 100000 (e.g. --shard 2/4: the second of four "
                               "shards; docs/cluster.md)";
  require(std::regex_match(value, m, re), "--shard: '" + printable(value) + "' is not accepted" + accepted);
  s.index = std::stoul(m[1].str());
  s.count = std::stoul(m[2].str());
  require(s.index <= s.count && s.count <= 100000, "--shard: '" + value + "' is not accepted" + accepted);
  return s;
}

std::vector<std::size_t> assign_shards(const std::vector<double>& cost, std::size_t count) {
  require(count >= 1, "assign_shards: count must be >= 1");
  const auto c = [&](std::size_t i) { return std::isfinite(cost[i]) && cost[i] > 0 ? cost[i] : 0.0; };
  std::vector<std::size_t> order(cost.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return c(a) > c(b); });
  std::vector<double> load(count, 0.0);
  std::vector<std::size_t> npts(count, 0);
  std::vector<std::size_t> owner(cost.size(), 0);
  for (std::size_t i : order) {
    // the least loaded shard; among equal loads the one with fewer points (zero-cost points spread too), then the lowest
    std::size_t best = 0;
    for (std::size_t s = 1; s < count; ++s)
      if (load[s] < load[best] || (load[s] == load[best] && npts[s] < npts[best])) best = s;
    load[best] += c(i);
    ++npts[best];
    owner[i] = best + 1;
  }
  return owner;
}

ShardPlan::ShardPlan(const ShardSpec& spec, const std::vector<double>& cost, const std::string& cost_model)
    : spec_(spec), cost_model_(cost_model) {
  if (!spec_.active()) {
    owner_.assign(cost.size(), 0);
    return;
  }
  require(spec_.count <= cost.size(),
          fmt::format("--shard: '{}/{}' is not accepted: this grid has {} point{}, so at most {} shard{}; give N <= {} "
                      "(an empty shard would write a file without rows)",
                      spec_.index, spec_.count, cost.size(), cost.size() == 1 ? "" : "s", cost.size(),
                      cost.size() == 1 ? "" : "s", cost.size()));
  owner_ = assign_shards(cost, spec_.count);
}

void ShardPlan::record(ResultsFile& f, const std::string& subcommand) const {
  if (!active()) return;
  std::string pts;
  for (std::size_t p = 0; p < owner_.size(); ++p)
    if (owner_[p] == spec_.index) pts += (pts.empty() ? "" : ",") + std::to_string(p);
  f.attr("/", "shard", fmt::format("{}/{}", spec_.index, spec_.count));
  f.attr("/", "shard_index", std::to_string(spec_.index));
  f.attr("/", "shard_count", std::to_string(spec_.count));
  f.attr("/", "shard_subcommand", subcommand);
  f.attr("/", "shard_points", pts);
  f.attr("/", "grid_points", std::to_string(owner_.size()));
  f.attr("/", "shard_cost_model", cost_model_);
}

void ShardPlan::mark_rows(ResultsFile& f, const std::string& object, const std::vector<std::int64_t>& keys) const {
  if (!active()) return;
  f.attr(object, "shard_row_keys", fmt::format("{}", fmt::join(keys, ",")));
}

std::map<std::string, MergeHook>& merge_hooks() {
  static std::map<std::string, MergeHook> hooks;
  return hooks;
}

Table MergedData::table(const std::string& g) const {
  Table t;
  std::vector<const std::pair<const std::string, Node>*> cols;
  for (const auto& kv : nodes)
    if (!kv.second.group && kv.first.rfind(g + "/", 0) == 0 && kv.first.find('/', g.size() + 1) == std::string::npos)
      cols.push_back(&kv);
  for (const auto* kv : cols) {
    const auto text = [&](const char* a) {
      const auto it = kv->second.attrs.find(a);
      return it != kv->second.attrs.end() && std::holds_alternative<std::string>(it->second)
                 ? std::get<std::string>(it->second) : std::string();
    };
    const char kind = std::holds_alternative<std::vector<double>>(kv->second.data)         ? 'd'
                      : std::holds_alternative<std::vector<std::int64_t>>(kv->second.data) ? 'i' : 's';
    t.col(kv->first.substr(g.size() + 1), kind, text("units"), text("description"));
  }
  const std::size_t n = cols.empty() ? 0 : cols.front()->second.dims.empty() ? 0 : cols.front()->second.dims[0];
  for (std::size_t r = 0; r < n; ++r) {
    std::vector<Table::Cell> row;
    for (const auto* kv : cols)
      std::visit([&](const auto& v) { row.emplace_back(v.at(r)); }, kv->second.data);
    t.row(row);
  }
  return t;
}

void MergedData::set_table(const std::string& g, const Table& t) {
  for (auto it = nodes.begin(); it != nodes.end();)
    if (!it->second.group && it->first.rfind(g + "/", 0) == 0 && it->first.find('/', g.size() + 1) == std::string::npos)
      it = nodes.erase(it);
    else
      ++it;
  for (const auto& c : t.columns()) {
    Node n;
    n.group = false;
    n.attrs["units"] = c.units;
    n.attrs["description"] = c.description;
    n.data = c.data;
    n.dims = {c.size()};
    nodes[g + "/" + c.name] = n;
  }
}

namespace {

// ---- reading a results file into MergedData nodes ----------------------------------------------------------
MergedData::Attr read_attr(H5::Attribute& a, const std::string& file, const std::string& where) {
  // one value: reading an empty (null dataspace) attribute crashed, and an array overran the one value read
  const hssize_t n = a.getSpace().getSimpleExtentNpoints();
  require(n == 1, "'" + file + "': attribute '" + a.getName() + "' of '" + where + "' holds " + std::to_string(n) +
                      " values; accepted: one text or one number (a kdalab results file)");
  if (a.getTypeClass() == H5T_STRING) {
    std::string s;
    a.read(a.getStrType(), s);
    return s;
  }
  require(a.getTypeClass() == H5T_FLOAT || a.getTypeClass() == H5T_INTEGER,
          "'" + file + "': attribute '" + a.getName() + "' of '" + where + "' is neither text nor a number");
  double v = 0;
  a.read(H5::PredType::NATIVE_DOUBLE, &v);
  return v;
}

void read_attrs(H5::H5Object& o, MergedData::Node& n, const std::string& file, const std::string& where) {
  for (int i = 0; i < o.getNumAttrs(); ++i) {
    H5::Attribute a = o.openAttribute(static_cast<unsigned>(i));
    n.attrs[a.getName()] = read_attr(a, file, where);
  }
}

void read_tree(H5::Group& g, const std::string& path, const std::string& file, MergedData& out) {
  MergedData::Node gn;
  read_attrs(g, gn, file, path);
  out.nodes[path] = gn;
  for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
    const std::string name = g.getObjnameByIdx(i);
    const std::string child = (path == "/" ? "" : path) + "/" + name;
    if (g.childObjType(name) == H5O_TYPE_GROUP) {
      H5::Group sub = g.openGroup(name);
      read_tree(sub, child, file, out);
      continue;
    }
    require(g.childObjType(name) == H5O_TYPE_DATASET, "'" + file + "': '" + child + "' is neither a group nor a dataset");
    H5::DataSet ds = g.openDataSet(name);
    MergedData::Node n;
    n.group = false;
    read_attrs(ds, n, file, child);
    H5::DataSpace sp = ds.getSpace();
    const int rank = sp.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
    if (rank > 0) sp.getSimpleExtentDims(dims.data());
    n.dims.assign(dims.begin(), dims.end());
    std::size_t numel = 1;
    for (auto d : n.dims) numel *= d;
    const auto cls = ds.getTypeClass();
    if (cls == H5T_FLOAT) {
      std::vector<double> v(numel);
      if (numel) ds.read(v.data(), H5::PredType::NATIVE_DOUBLE);
      n.data = std::move(v);
    } else if (cls == H5T_INTEGER) {
      std::vector<std::int64_t> v(numel);
      if (numel) ds.read(v.data(), H5::PredType::NATIVE_INT64);
      n.data = std::move(v);
    } else {
      require(cls == H5T_STRING && rank == 1, "'" + file + "': dataset '" + child + "' is not a number array or a string column");
      n.data = h5read::strings(file, child);
    }
    out.nodes[child] = std::move(n);
  }
}

MergedData read_file(const std::string& file) {
  H5::Exception::dontPrint();
  MergedData d;
  try {
    H5::H5File f(file, H5F_ACC_RDONLY);
    H5::Group root = f.openGroup("/");
    read_tree(root, "/", file, d);
  } catch (const H5::Exception& e) {
    throw Error("'" + file + "' cannot be read as an HDF5 results file: " + e.getDetailMsg());
  }
  return d;
}

std::string attr_text(const MergedData::Node& n, const std::string& name) {
  const auto it = n.attrs.find(name);
  if (it == n.attrs.end()) return "";
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  return fmt::format("{}", std::get<double>(it->second));
}

std::vector<std::int64_t> parse_keys(const std::string& text, const std::string& file, const std::string& path,
                                     const char* name = "shard_row_keys") {
  std::vector<std::int64_t> k;
  std::size_t a = 0;
  while (a < text.size()) {
    const std::size_t b = std::min(text.find(',', a), text.size());
    // each item whole, as written ("5abc" and "" are not integers)
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data() + a, text.data() + b, v);
    if (b == a || ec != std::errc() || end != text.data() + b)
      throw Error("'" + file + "': attribute " + name + " of '" + path + "' is not a list of integers");
    k.push_back(v);
    a = b + 1;
  }
  return k;
}

/// `text`, the root attribute `name` of shard file `file`, as a decimal integer in [lo, hi]; otherwise kdalab::Error
/// naming the file, the attribute, its value and the range.
std::size_t shard_attr_number(const std::string& text, const std::string& file, const char* name, std::size_t lo,
                              std::size_t hi) {
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  require(!text.empty() && ec == std::errc() && end == text.data() + text.size() && v >= lo && v <= hi,
          fmt::format("'{}': root attribute {} = '{}' is not accepted; a shard file holds an integer in [{}, {}]", file,
                      name, printable(text), lo, hi));
  return v;
}

/// The root attributes that tell one sharded run from another (compared between shards).
nlohmann::json comparable_config(const std::string& text, const std::string& file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception&) {
    throw Error("'" + file + "': root attribute config is not JSON");
  }
  // what may differ between the shards of one run: the shard itself, each shard's own --out, its progress lines
  for (const char* k : {"shard", "out", "quiet"}) j.erase(k);
  return j;
}

/// Rows `keys` of one table or array per shard -> their merged order: stable by key over the shards in index order.
struct Piece {
  std::size_t shard;
  std::size_t row;
  std::int64_t key;
};

template <class T>
std::vector<T> gather(const std::vector<const std::vector<T>*>& parts, const std::vector<Piece>& order, std::size_t width) {
  std::vector<T> out;
  out.reserve(order.size() * width);
  for (const Piece& p : order)
    for (std::size_t j = 0; j < width; ++j) out.push_back((*parts[p.shard])[p.row * width + j]);
  return out;
}

int run_merge(Context& ctx, const std::vector<std::string>& files) {
  require(!files.empty(), "no shard files given; give the files written with --shard 1/N ... N/N");
  std::vector<MergedData> shards;
  for (const auto& f : files) {
    require(std::filesystem::is_regular_file(f), "shard file '" + f + "' does not exist or is not a regular file");
    shards.push_back(read_file(f));
  }
  // ---- the shards come from one sharded run, and cover the grid once ----
  const auto root = [&](std::size_t i, const char* a) { return attr_text(shards[i].nodes.at("/"), a); };
  for (std::size_t i = 0; i < shards.size(); ++i)
    require(!root(i, "shard").empty(), "'" + files[i] + "' is not a shard file (no root attribute shard); "
                                       "write shards with --shard I/N (docs/cluster.md)");
  const nlohmann::json cfg0 = comparable_config(root(0, "config"), files[0]);
  for (std::size_t i = 1; i < shards.size(); ++i) {
    for (const char* a : {"software", "software_version", "git_sha"})
      require(root(i, a) == root(0, a),
              fmt::format("'{}' was written by another build ({} '{}') than '{}' ('{}'); merge the shards of one "
                          "build of one run", files[i], a, root(i, a), files[0], root(0, a)));
    require(root(i, "shard_subcommand") == root(0, "shard_subcommand"),
            fmt::format("'{}' is a shard of '{}', '{}' of '{}'; merge the shards of one run", files[i],
                        root(i, "shard_subcommand"), files[0], root(0, "shard_subcommand")));
    require(root(i, "seed") == root(0, "seed"),
            fmt::format("'{}' has seed {}, '{}' seed {}; merge the shards of one run", files[i], root(i, "seed"),
                        files[0], root(0, "seed")));
    const nlohmann::json cfg = comparable_config(root(i, "config"), files[i]);
    if (cfg.dump() != cfg0.dump()) {
      std::string key;
      for (const auto& [k, v] : cfg.items())
        if (!cfg0.contains(k) || cfg0[k] != v) { key = k; break; }
      if (key.empty())
        for (const auto& [k, v] : cfg0.items())
          if (!cfg.contains(k)) { key = k; break; }
      throw Error(fmt::format("'{}' has another config than '{}' (option {}: {} vs {}); merge the shards of one "
                              "run", files[i], files[0], key, cfg.contains(key) ? cfg[key].dump() : "absent",
                              cfg0.contains(key) ? cfg0[key].dump() : "absent"));
    }
    require(root(i, "shard_count") == root(0, "shard_count") && root(i, "grid_points") == root(0, "grid_points"),
            fmt::format("'{}' is shard {} of a grid of {} points, '{}' shard {} of {}; merge the shards of one run",
                        files[i], root(i, "shard"), root(i, "grid_points"), files[0], root(0, "shard"),
                        root(0, "grid_points")));
  }
  // the counts as --shard takes them (N <= 100000 <= grid points); the grid's points are kept per point listed, not
  // per point of the grid, so a grid size read from a file allocates nothing
  const std::size_t count = shard_attr_number(root(0, "shard_count"), files[0], "shard_count", 1, 100000);
  const std::size_t grid = shard_attr_number(root(0, "grid_points"), files[0], "grid_points", count,
                                             static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()));
  std::vector<std::size_t> file_of_index(count + 1, shards.size());
  std::map<std::size_t, std::size_t> file_of_point;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::size_t idx = shard_attr_number(root(i, "shard_index"), files[i], "shard_index", 1, count);
    if (file_of_index[idx] != shards.size())
      throw Error(fmt::format("'{}' and '{}' are both shard {}; give each shard once", files[file_of_index[idx]],
                              files[i], root(i, "shard")));
    file_of_index[idx] = i;
    for (const auto k : parse_keys(root(i, "shard_points"), files[i], "/", "shard_points")) {
      require(k >= 0 && static_cast<std::size_t>(k) < grid, "'" + files[i] + "': a shard point is out of range");
      const auto p = static_cast<std::size_t>(k);
      if (const auto it = file_of_point.find(p); it != file_of_point.end())
        throw Error(fmt::format("grid point {} is in '{}' and in '{}'; give shards that cover each point once", p,
                                files[it->second], files[i]));
      file_of_point[p] = i;
    }
  }
  std::vector<std::size_t> missing;
  for (std::size_t s = 1; s <= count; ++s)
    if (file_of_index[s] == shards.size()) missing.push_back(s);
  // the first 100 points in no file (the loop passes at most the listed points besides them)
  std::vector<std::size_t> uncovered;
  for (std::size_t p = 0; p < grid && uncovered.size() < 100; ++p)
    if (!file_of_point.count(p)) uncovered.push_back(p);
  const std::size_t n_uncovered = grid - file_of_point.size();
  const std::string points = fmt::format("grid points {}{} are in no file given", fmt::join(uncovered, ", "),
                                         n_uncovered > uncovered.size()
                                             ? fmt::format(" and {} more", n_uncovered - uncovered.size())
                                             : std::string());
  require(missing.empty() && uncovered.empty(),
          missing.empty() ? fmt::format("{}; give every shard 1..{} once, each with its own points", points, count)
                          : fmt::format("shard{} {} of {} missing ({}); give every shard 1..{} once",
                                        missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), count, points, count));

  // ---- join: the first shard's tree, each sharded table or array's rows from every shard in key order ----
  // shards in index order: rows of equal keys cannot come from two shards (a point is in one), so the order is the
  // unsharded run's
  std::vector<std::size_t> by_index;
  for (std::size_t s = 1; s <= count; ++s) by_index.push_back(file_of_index[s]);
  MergedData m = shards[by_index[0]];
  m.shard_files = files;
  std::set<std::string> sharded;
  for (const auto& [path, node] : m.nodes)
    if (node.attrs.count("shard_row_keys")) sharded.insert(path);
  for (const std::string& path : sharded) {
    std::vector<Piece> order;
    for (std::size_t s = 0; s < by_index.size(); ++s) {
      const auto& nodes = shards[by_index[s]].nodes;
      const auto it = nodes.find(path);
      require(it != nodes.end() && it->second.attrs.count("shard_row_keys"),
              "'" + files[by_index[s]] + "' has no sharded '" + path + "' (a shard of another kind of run)");
      const auto keys = parse_keys(attr_text(it->second, "shard_row_keys"), files[by_index[s]], path);
      for (std::size_t r = 0; r < keys.size(); ++r) order.push_back({s, r, keys[r]});
    }
    std::stable_sort(order.begin(), order.end(), [](const Piece& a, const Piece& b) { return a.key < b.key; });
    // a table group: its column datasets; an array: itself (rows along its first dimension)
    std::vector<std::string> targets;
    if (m.nodes.at(path).group) {
      for (const auto& [p, n] : m.nodes)
        if (!n.group && p.rfind(path + "/", 0) == 0 && p.find('/', path.size() + 1) == std::string::npos) targets.push_back(p);
    } else {
      targets.push_back(path);
    }
    for (const std::string& t : targets) {
      auto& node = m.nodes.at(t);
      std::size_t width = 1;
      for (std::size_t j = 1; j < node.dims.size(); ++j) width *= node.dims[j];
      std::visit(
          [&](const auto& first) {
            using V = std::decay_t<decltype(first)>;
            std::vector<const V*> parts;
            for (std::size_t s = 0; s < by_index.size(); ++s) {
              const auto& sn = shards[by_index[s]].nodes;
              const auto it = sn.find(t);
              require(it != sn.end() && std::holds_alternative<V>(it->second.data),
                      "'" + files[by_index[s]] + "' has no dataset '" + t + "' of the first shard's kind");
              parts.push_back(&std::get<V>(it->second.data));
              std::size_t rows = it->second.dims.empty() ? 0 : it->second.dims[0];
              require(rows * width == parts.back()->size(),
                      "'" + files[by_index[s]] + "': dataset '" + t + "' has another row width");
            }
            for (const Piece& p : order) {
              const auto& sn = shards[by_index[p.shard]].nodes.at(t);
              require(p.row < (sn.dims.empty() ? 0 : sn.dims[0]),
                      "'" + files[by_index[p.shard]] + "': '" + t + "' has fewer rows than its shard_row_keys");
            }
            node.data = gather(parts, order, width);
          },
          node.data);
      node.dims[0] = order.size();
    }
    m.nodes.at(path).attrs.erase("shard_row_keys");
  }
  // groups whose child groups are one per grid point (shard_row_groups; train_recall's runs/NNN): every shard's
  // children, each child once
  std::set<std::string> row_groups;
  for (const auto& [path, node] : m.nodes)
    if (node.group && node.attrs.count("shard_row_groups")) row_groups.insert(path);
  for (const std::string& path : row_groups) {
    const std::string prefix = path + "/";
    const auto under = [&](const std::string& p) { return p.rfind(prefix, 0) == 0; };
    for (auto it = m.nodes.begin(); it != m.nodes.end();) it = under(it->first) ? m.nodes.erase(it) : std::next(it);
    std::map<std::string, std::size_t> owner;  // child name -> the shard (position in by_index) that holds it
    for (std::size_t s = 0; s < by_index.size(); ++s) {
      const auto& nodes = shards[by_index[s]].nodes;
      const auto it = nodes.find(path);
      require(it != nodes.end() && it->second.group && it->second.attrs.count("shard_row_groups"),
              "'" + files[by_index[s]] + "' has no sharded group '" + path + "' (a shard of another kind of run)");
      for (const auto& [p, n] : nodes) {
        if (!under(p)) continue;
        const std::string child = p.substr(prefix.size(), p.find('/', prefix.size()) - prefix.size());
        const auto [o, fresh] = owner.emplace(child, s);
        if (!fresh && o->second != s)
          throw Error(fmt::format("'{}{}' is in '{}' and in '{}'; give shards that cover each point once", prefix,
                                  child, files[by_index[o->second]], files[by_index[s]]));
        m.nodes[p] = n;
      }
    }
    m.nodes.at(path).attrs.erase("shard_row_groups");
  }
  // attributes each shard has in its own version (notes the hook rebuilds)
  for (auto& [path, node] : m.nodes)
    for (auto it = node.attrs.begin(); it != node.attrs.end();) {
      if (it->first != "shard_note_events") { ++it; continue; }
      auto& list = m.per_shard_attr[path];
      for (std::size_t s : by_index) list.push_back(attr_text(shards[s].nodes.at(path), "shard_note_events"));
      it = node.attrs.erase(it);
    }
  const std::string sub = root(0, "shard_subcommand");
  if (const auto h = merge_hooks().find(sub); h != merge_hooks().end()) h->second(m);

  // ---- write through the results writer: root attributes of this merge, then every group and dataset ----
  nlohmann::json cfg = nlohmann::json::parse(root(by_index[0], "config"));
  cfg.erase("shard");
  cfg["out"] = ctx.common.out;
  ResultsFile f(ctx.common.out, ctx.common.force, RunInfo{ctx.command_line, cfg.dump(), root(0, "seed")});
  nlohmann::json rec = nlohmann::json::array();
  for (std::size_t s : by_index)
    rec.push_back({{"file", files[s]}, {"shard", root(s, "shard")}, {"points", root(s, "shard_points")},
                   {"command_line", root(s, "command_line")}, {"date", root(s, "date")}, {"host", root(s, "host")},
                   {"device", root(s, "device")}, {"git_sha", root(s, "git_sha")},
                   {"software_version", root(s, "software_version")}});  // the build that ran them (equal, checked above)
  f.attr("/", "merged_shards", rec.dump());
  f.attr("/", "merged_subcommand", sub);
  for (const auto& [path, node] : m.nodes) {
    if (path == "/") continue;  // the root attributes are this merge's (RunInfo above)
    const auto slash = path.rfind('/');
    const std::string parent = slash == 0 ? "/" : path.substr(0, slash), name = path.substr(slash + 1);
    if (node.group) {
      // the group exists before its attributes are set (a numeric attribute needs it)
      f.group(path, node.attrs.count("description") ? attr_text(node, "description") : std::string());
      if (!node.attrs.count("description")) throw Error("group '" + path + "' of '" + files[by_index[0]] + "' has no description");
      for (const auto& [k, v] : node.attrs) {
        if (const auto* s = std::get_if<std::string>(&v)) f.attr(path, k, *s);
        else f.attr(path, k, std::get<double>(v));
      }
      continue;
    }
    const std::string units = attr_text(node, "units"), desc = attr_text(node, "description");
    if (const auto* d = std::get_if<std::vector<double>>(&node.data); d && node.dims.size() != 1) {
      Tensor<double> t(node.dims);
      t.data = *d;
      std::map<std::string, std::string> sattrs;
      for (const auto& [k, v] : node.attrs)
        if (const auto* s = std::get_if<std::string>(&v); s && k != "units" && k != "description") sattrs[k] = *s;
      f.write_array(parent, name, t, units, desc, sattrs);
    } else {
      Table t;
      const char kind = std::holds_alternative<std::vector<double>>(node.data) ? 'd'
                        : std::holds_alternative<std::vector<std::int64_t>>(node.data) ? 'i' : 's';
      t.col(name, kind, units, desc);
      std::visit([&](const auto& v) { for (const auto& x : v) t.row({x}); }, node.data);
      f.write_table(parent, t);
      for (const auto& [k, v] : node.attrs)
        if (const auto* s = std::get_if<std::string>(&v); s && k != "units" && k != "description") f.attr(path, k, *s);
    }
    for (const auto& [k, v] : node.attrs)
      if (const auto* x = std::get_if<double>(&v)) f.attr(path, k, *x);
  }
  f.commit();
  fmt::print("merge: wrote {} ({}: {} shards, {} grid points)\n", ctx.common.out, sub, count, grid);
  return 0;
}

}  // namespace

void register_merge(Registry& reg) {
  // python -m kdalab.train_recall --shard (docs/recall-training.md): best_lr compares the learning rates of one model,
  // which may lie in different shards; the run count and note are the whole grid's
  merge_hooks()["train_recall"] = [](MergedData& m) {
    const std::string g = "/train_recall";
    if (!m.nodes.count(g + "/best_lr")) return;
    const Table t = m.table(g);
    const auto text = [&](const char* c, std::size_t r) {
      const auto* v = std::get_if<std::vector<std::string>>(&t.column(c).data);
      return v ? v->at(r) : std::string();
    };
    const auto num = [&](const char* c, std::size_t r) {
      return std::visit([&](const auto& v) -> double {
        if constexpr (std::is_arithmetic_v<typename std::decay_t<decltype(v)>::value_type>) return static_cast<double>(v.at(r));
        else return std::nan("");
      }, t.column(c).data);
    };
    // the first row of best test accuracy among the rows of one (task, L, N, vocab, d_model, mixer) gets 1
    std::map<std::string, std::size_t> best;
    for (std::size_t r = 0; r < t.rows(); ++r) {
      const std::string key = fmt::format("{}|{}|{}|{}|{}|{}", text("task", r), num("seq_len", r), num("kv_pairs", r),
                                          num("vocab", r), num("d_model", r), text("mixer", r));
      const auto [it, fresh] = best.emplace(key, r);
      if (!fresh && num("test_accuracy", r) > num("test_accuracy", it->second)) it->second = r;
    }
    std::vector<std::int64_t> flags(t.rows(), 0);
    for (const auto& kv : best) flags[kv.second] = 1;
    m.nodes.at(g + "/best_lr").data = flags;
    const auto n = static_cast<double>(t.rows());
    auto& attrs = m.nodes.at(g).attrs;
    attrs["runs"] = n;
    const auto grid = attrs.find("grid");
    const bool reduced = grid != attrs.end() && std::holds_alternative<std::string>(grid->second) &&
                         std::get<std::string>(grid->second).ends_with("-reduced");
    attrs["note"] = fmt::format("{}{} runs", reduced ? "reduced grid: " : "", t.rows());
  };
  auto files = std::make_shared<std::vector<std::string>>();
  auto& c = reg.add("merge",
                    "Joins the files of a sharded sweep (each written with --shard I/N) into the file the unsharded run "
                    "writes (timing columns aside): checks that they come from one build, subcommand, config and seed "
                    "and cover the grid once (docs/cluster.md).",
                    "results/merged.h5");
  c.app->add_option("shards", *files, "the shard files (SHARD.h5 ...), each shard 1..N once, in any order")
      ->required()
      ->expected(1, -1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c.app->get_option("--seed")->description("no effect for merge (the shards' seed is recorded)");
  c.app->get_option("--quick")->description("no effect for merge");
  c.app->get_option("--quiet")->description("no effect for merge (it prints no progress lines)");
  c.inputs = {};
  c.check = [files](Context& ctx) {
    for (const auto& f : *files)
      require(!same_file(f, ctx.common.out),
              "--out '" + ctx.common.out + "' is the shard file '" + f + "'; give another results file (shard files "
              "are read, never overwritten)");
    for (std::size_t i = 0; i < files->size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        require_once(!same_file((*files)[i], (*files)[j]), "shard file", (*files)[i]);
  };
  c.run = [files](Context& ctx) { return run_merge(ctx, *files); };
}

}  // namespace kdalab::cli
