#include "experiments/results.hpp"

#include <H5Cpp.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "experiments/build_info.hpp"
#include "reference/error.hpp"

namespace kdalab {
namespace fs = std::filesystem;

// ---- Column / Table ----------------------------------------------------------------------------
std::size_t Column::size() const {
  return std::visit([](const auto& v) { return v.size(); }, data);
}

Table& Table::col(const std::string& name, char kind, const std::string& units, const std::string& description) {
  require(n_rows_ == 0, "table column '" + name + "' declared after rows were added");
  Column c{name, units, description, {}};
  if (kind == 'd') c.data = std::vector<double>{};
  else if (kind == 'i') c.data = std::vector<std::int64_t>{};
  else if (kind == 's') c.data = std::vector<std::string>{};
  else throw Error("table column '" + name + "': kind must be 'd', 'i' or 's'");
  cols_.push_back(std::move(c));
  return *this;
}

void Table::row(const std::vector<Cell>& cells) {
  require(cells.size() == cols_.size(), "table row has " + std::to_string(cells.size()) + " cells, table has " +
                                            std::to_string(cols_.size()) + " columns");
  for (std::size_t i = 0; i < cells.size(); ++i) {
    auto& c = cols_[i];
    if (auto* v = std::get_if<std::vector<double>>(&c.data)) {
      if (auto* x = std::get_if<double>(&cells[i])) v->push_back(*x);
      else if (auto* n = std::get_if<std::int64_t>(&cells[i])) v->push_back(static_cast<double>(*n));
      else throw Error("table column '" + c.name + "' is numeric, got a string");
    } else if (auto* v = std::get_if<std::vector<std::int64_t>>(&c.data)) {
      if (auto* n = std::get_if<std::int64_t>(&cells[i])) v->push_back(*n);
      else throw Error("table column '" + c.name + "' is integer, got another kind");
    } else {
      auto* s = std::get_if<std::string>(&cells[i]);
      require(s != nullptr, "table column '" + c.name + "' is string, got a number");
      std::get<std::vector<std::string>>(c.data).push_back(*s);
    }
  }
  ++n_rows_;
}

const Column& Table::column(const std::string& name) const {
  for (const auto& c : cols_)
    if (c.name == name) return c;
  throw Error("table has no column '" + name + "'");
}

// ---- writer --------------------------------------------------------------------------------------
namespace {
H5::StrType vlen_utf8() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}
void set_str_attr(H5::H5Object& obj, const std::string& name, const std::string& value) {
  auto t = vlen_utf8();
  if (obj.attrExists(name)) obj.removeAttr(name);
  H5::Attribute a = obj.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
  a.write(t, value);
}
void set_num_attr(H5::H5Object& obj, const std::string& name, double value) {
  if (obj.attrExists(name)) obj.removeAttr(name);
  H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_DOUBLE, &value);
}
}  // namespace

struct ResultsFile::Impl {
  H5::H5File file;
  /// Opens group g, creating it and any missing parent groups.
  H5::Group open_group(const std::string& g) {
    if (g == "/" || g.empty()) return file.openGroup("/");
    std::size_t pos = 0;
    while (true) {
      pos = g.find('/', pos + 1);
      const std::string part = g.substr(0, pos);
      if (!part.empty() && part != "/" && !file.nameExists(part)) file.createGroup(part);
      if (pos == std::string::npos) break;
    }
    return file.openGroup(g);
  }
};

void check_output_path(const std::string& path, bool force) {
  require(!path.empty(), "--out: an output file name is required (e.g. --out results/run.h5)");
  const fs::path p(path);
  // every query with an error_code: a path the system cannot look up (too long: ENAMETOOLONG, a loop of links, a
  // folder not searchable) is named as --out, not reported as a bare "filesystem error"
  const auto unusable = [&](const std::error_code& ec) {
    if (ec == std::errc::filename_too_long)
      return Error("--out '" + path + "': the path is too long for the file system (" + ec.message() +
                   "); give a path of at most 4095 bytes, each folder name at most 255 bytes and the file name at most 231");
    return Error("--out '" + path + "': the path cannot be looked up (" + ec.message() +
                 "); give a file name in an existing folder you can write to");
  };
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (ec && st.type() != fs::file_type::not_found) throw unusable(ec);
  if (fs::exists(st)) {
    require(!fs::is_directory(st), "--out '" + path + "' is a directory; give a file name ending in .h5");
    // a FIFO or a device would be replaced by a regular file even with --force (we may run as root: /dev/null)
    require(fs::is_regular_file(st), "--out '" + path + "' is not a regular file (a FIFO, device, socket or other "
                                     "special file); give the name of a new or regular file (only a regular file is "
                                     "ever replaced, with --force)");
    require(force, "--out '" + path + "' already exists; pass --force to overwrite it (the old file is kept otherwise)");
  }
  require(p.filename().string().size() + 24 <= 255,
          "--out '" + path + "': the file name is too long (the temporary '<name>.tmp.<pid>' must fit in 255 bytes)");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const fs::file_status dst = fs::status(dir, ec);
  if (ec && dst.type() != fs::file_type::not_found) throw unusable(ec);
  require(fs::is_directory(dst), "--out '" + path + "': folder '" + dir.string() + "' does not exist; create it first");
  require(::access(dir.c_str(), W_OK) == 0, "--out '" + path + "': folder '" + dir.string() + "' is not writable");
}

ResultsFile::ResultsFile(const std::string& path, bool force, const RunInfo& info)
    : impl_(std::make_unique<Impl>()), path_(path), force_(force) {
  check_output_path(path, force);
  tmp_ = path + ".tmp." + std::to_string(::getpid());
  H5::Exception::dontPrint();
  try {
    impl_->file = H5::H5File(tmp_, H5F_ACC_TRUNC);
    H5::Group root = impl_->file.openGroup("/");
    set_str_attr(root, "software", "kdalab");
    set_str_attr(root, "software_version", software_version());
    set_str_attr(root, "git_sha", git_sha());
    set_str_attr(root, "date", iso8601_utc_now());
    set_str_attr(root, "command_line", info.command_line);
    set_str_attr(root, "config", info.config_json);
    set_str_attr(root, "host", host_name());
    set_str_attr(root, "device", device_description());
    set_str_attr(root, "seed", info.seed);
  } catch (const H5::Exception& e) {
    std::error_code ec;
    fs::remove(tmp_, ec);
    throw Error("--out '" + path + "': cannot create HDF5 file '" + tmp_ + "': " + e.getDetailMsg());
  }
}

ResultsFile::~ResultsFile() {
  if (committed_) return;
  try { impl_->file.close(); } catch (...) {}
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void ResultsFile::group(const std::string& g, const std::string& description) {
  H5::Group grp = impl_->open_group(g);
  set_str_attr(grp, "description", description);
}

void ResultsFile::write_table(const std::string& g, const Table& table) {
  H5::Group grp = impl_->open_group(g);
  for (const auto& c : table.columns()) {
    require(c.size() == table.rows(), "table column '" + c.name + "' length differs from the row count");
    hsize_t dims[1] = {c.size()};
    H5::DataSpace space(1, dims);
    H5::DataSet ds;
    if (auto* v = std::get_if<std::vector<double>>(&c.data)) {
      ds = grp.createDataSet(c.name, H5::PredType::NATIVE_DOUBLE, space);
      if (!v->empty()) ds.write(v->data(), H5::PredType::NATIVE_DOUBLE);
    } else if (auto* v = std::get_if<std::vector<std::int64_t>>(&c.data)) {
      ds = grp.createDataSet(c.name, H5::PredType::NATIVE_INT64, space);
      if (!v->empty()) ds.write(v->data(), H5::PredType::NATIVE_INT64);
    } else {
      const auto& s = std::get<std::vector<std::string>>(c.data);
      auto t = vlen_utf8();
      ds = grp.createDataSet(c.name, t, space);
      std::vector<const char*> p;
      for (const auto& x : s) p.push_back(x.c_str());
      if (!p.empty()) ds.write(p.data(), t);
    }
    set_str_attr(ds, "units", c.units);
    set_str_attr(ds, "description", c.description);
  }
}

void ResultsFile::write_array(const std::string& g, const std::string& name, const Tensor<double>& t,
                              const std::string& units, const std::string& description,
                              const std::map<std::string, std::string>& attrs) {
  H5::Group grp = impl_->open_group(g);
  // A fixed array, not a vector: g++ 13 reports a false -Wfree-nonheap-object on the vector form.
  require(t.rank() <= 32, "write_array '" + name + "': rank " + std::to_string(t.rank()) + " > 32");
  hsize_t dims[32];
  const int rank = t.rank() == 0 ? 1 : static_cast<int>(t.rank());
  for (int i = 0; i < rank; ++i) dims[i] = t.rank() == 0 ? 1 : t.shape[static_cast<std::size_t>(i)];
  H5::DataSpace space(rank, dims);
  H5::DataSet ds = grp.createDataSet(name, H5::PredType::NATIVE_DOUBLE, space);
  if (t.numel()) ds.write(t.data.data(), H5::PredType::NATIVE_DOUBLE);
  set_str_attr(ds, "units", units);
  set_str_attr(ds, "description", description);
  for (const auto& [k, v] : attrs) set_str_attr(ds, k, v);
}

void ResultsFile::attr(const std::string& g, const std::string& name, const std::string& value) {
  H5::Group grp = impl_->open_group(g);
  set_str_attr(grp, name, value);
}

void ResultsFile::attr(const std::string& object, const std::string& name, double value) {
  if (object == "/" || impl_->file.childObjType(object) == H5O_TYPE_GROUP) {
    H5::Group grp = impl_->open_group(object);
    set_num_attr(grp, name, value);
  } else {
    H5::DataSet ds = impl_->file.openDataSet(object);
    set_num_attr(ds, name, value);
  }
}

void ResultsFile::commit() {
  require(!committed_, "results file committed twice");
  impl_->file.close();
  if (fs::exists(path_) && !force_) {
    throw Error("--out '" + path_ + "' appeared while the run was going; not overwritten (pass --force)");
  }
  fs::rename(tmp_, path_);
  committed_ = true;
}

// ---- reader --------------------------------------------------------------------------------------
namespace h5read {
namespace {
H5::H5File open(const std::string& file) {
  H5::Exception::dontPrint();
  require(fs::exists(file), "input file '" + file + "' does not exist");
  try {
    return H5::H5File(file, H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    throw Error("input file '" + file + "' is not a readable HDF5 file: " + e.getDetailMsg());
  }
}
bool path_exists(H5::H5File& f, const std::string& path) {
  // nameExists only checks the last link; walk the components.
  std::string acc;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    const std::size_t next = path.find('/', pos + 1);
    acc = path.substr(0, next);
    if (!acc.empty() && acc != "/" && !f.nameExists(acc)) return false;
    pos = next;
  }
  return true;
}
H5::H5Object* open_obj(H5::H5File& f, const std::string& file, const std::string& object, H5::Group& g, H5::DataSet& d) {
  if (object == "/" || object.empty()) { g = f.openGroup("/"); return &g; }
  require(path_exists(f, object), "file '" + file + "' has no object '" + object + "'");
  if (f.childObjType(object) == H5O_TYPE_GROUP) { g = f.openGroup(object); return &g; }
  d = f.openDataSet(object);
  return &d;
}
}  // namespace

bool exists(const std::string& file, const std::string& path) {
  auto f = open(file);
  return path == "/" || path_exists(f, path);
}

Tensor<double> array(const std::string& file, const std::string& dataset) {
  auto f = open(file);
  require(path_exists(f, dataset), "file '" + file + "' has no dataset '" + dataset + "'");
  require(f.childObjType(dataset) == H5O_TYPE_DATASET, "'" + dataset + "' in '" + file + "' is not a dataset");
  H5::DataSet ds = f.openDataSet(dataset);
  require(ds.getTypeClass() == H5T_FLOAT || ds.getTypeClass() == H5T_INTEGER,
          "dataset '" + dataset + "' in '" + file + "' is not numeric");
  H5::DataSpace sp = ds.getSpace();
  const int rank = sp.getSimpleExtentNdims();
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
  if (rank > 0) sp.getSimpleExtentDims(dims.data());
  Tensor<double> t(std::vector<std::size_t>(dims.begin(), dims.end()));
  if (t.numel()) ds.read(t.data.data(), H5::PredType::NATIVE_DOUBLE);
  return t;
}

std::vector<std::string> strings(const std::string& file, const std::string& dataset) {
  auto f = open(file);
  require(path_exists(f, dataset), "file '" + file + "' has no dataset '" + dataset + "'");
  H5::DataSet ds = f.openDataSet(dataset);
  require(ds.getTypeClass() == H5T_STRING, "dataset '" + dataset + "' in '" + file + "' is not a string column");
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<std::string> out;
  if (const H5::StrType ft = ds.getStrType(); !ft.isVariableStr()) {  // fixed-length (e.g. numpy 'S'), NUL-padded
    const std::size_t len = ft.getSize();
    std::vector<char> buf(n * len);
    if (n) ds.read(buf.data(), ft);
    for (hsize_t i = 0; i < n; ++i) out.emplace_back(buf.data() + i * len, strnlen(buf.data() + i * len, len));
    return out;
  }
  std::vector<char*> p(n, nullptr);
  const H5::StrType t = ds.getStrType();  // the file's own variable-length type: ASCII or UTF-8 (no charset conversion)
  if (n) ds.read(p.data(), t);
  for (auto* s : p) out.emplace_back(s ? s : "");
  if (n) H5::DataSet::vlenReclaim(p.data(), t, ds.getSpace());
  return out;
}

bool has_attr(const std::string& file, const std::string& object, const std::string& name) {
  auto f = open(file);
  H5::Group g; H5::DataSet d;
  if (object != "/" && !path_exists(f, object)) return false;
  return open_obj(f, file, object, g, d)->attrExists(name);
}

std::string attr_string(const std::string& file, const std::string& object, const std::string& name) {
  auto f = open(file);
  H5::Group g; H5::DataSet d;
  auto* o = open_obj(f, file, object, g, d);
  require(o->attrExists(name), "'" + object + "' in '" + file + "' has no attribute '" + name + "'");
  H5::Attribute a = o->openAttribute(name);
  require(a.getTypeClass() == H5T_STRING, "attribute '" + name + "' of '" + object + "' in '" + file + "' is not a string");
  std::string s;
  a.read(a.getStrType(), s);
  return s;
}

double attr_double(const std::string& file, const std::string& object, const std::string& name) {
  auto f = open(file);
  H5::Group g; H5::DataSet d;
  auto* o = open_obj(f, file, object, g, d);
  require(o->attrExists(name), "'" + object + "' in '" + file + "' has no attribute '" + name + "'");
  H5::Attribute a = o->openAttribute(name);
  if (a.getTypeClass() == H5T_STRING) {
    std::string s;
    a.read(a.getStrType(), s);
    try { return std::stod(s); } catch (...) {
      throw Error("attribute '" + name + "' of '" + object + "' in '" + file + "' = '" + s + "' is not a number");
    }
  }
  require(a.getTypeClass() == H5T_FLOAT || a.getTypeClass() == H5T_INTEGER,
          "attribute '" + name + "' of '" + object + "' in '" + file + "' is not numeric");
  double v = 0;
  a.read(H5::PredType::NATIVE_DOUBLE, &v);
  return v;
}

std::vector<std::string> members(const std::string& file, const std::string& group) {
  auto f = open(file);
  require(group == "/" || path_exists(f, group), "file '" + file + "' has no group '" + group + "'");
  H5::Group g = f.openGroup(group.empty() ? "/" : group);
  std::vector<std::string> out;
  for (hsize_t i = 0; i < g.getNumObjs(); ++i) out.push_back(g.getObjnameByIdx(i));
  return out;
}
}  // namespace h5read

// ---- build / host facts ------------------------------------------------------------------------------
std::string software_version() { return build_info::version; }
std::string git_sha() { return build_info::git_sha; }

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string device_description() {
  std::string cpu = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  std::string d = "CPU: " + cpu;
  for (const auto& g : build_info::gpu_devices()) d += "; GPU: " + g;
  return d;
}

std::string iso8601_utc_now() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace kdalab
