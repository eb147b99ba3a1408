// Scalar logs a training run writes beside its JSON lines: a CSV table and
// TensorBoard event files. Both take one row of named scalars per step.
//
// TensorBoard's format: a file events.out.tfevents.<seconds>.<host>.ptc of
// TFRecords (little-endian uint64 length, masked CRC-32C of the length, the
// bytes, masked CRC-32C of the bytes), each an Event protocol buffer: the first
// carries file_version "brain.Event:2", the others wall_time, step and a
// Summary of {tag, simple_value} values. TensorBoard, tensorboardX and
// tf.data read these files.
#ifndef PTC_RUNTIME_IO_SCALAR_LOG_H
#define PTC_RUNTIME_IO_SCALAR_LOG_H

#include "runtime/base/status.h"

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ptc {

/// One step's scalars, in a fixed order; a missing value (no eval this
/// step, no grad norm in this plan) is nullopt.
using ScalarRow = std::vector<std::pair<std::string, std::optional<double>>>;

/// CRC-32C (Castagnoli), and TFRecord's masking of it.
uint32_t crc32c(const void *data, size_t size);
uint32_t maskedCrc32c(const void *data, size_t size);

/// A CSV file with a header row: the columns are the first row's names (a
/// later name the header lacks is an error, so the table stays rectangular).
/// Appending to a file that has a header (a resumed run) keeps its header,
/// which must then be the same.
class CsvScalarLog {
public:
  Status open(const std::string &path, bool append);
  Status write(const ScalarRow &row);

private:
  std::string path_;
  std::ofstream out_;
  std::vector<std::string> columns_;
  std::string existingHeader_;
};

/// TensorBoard scalar event files in a directory (created when missing); a
/// new file per run, so a resumed run adds a file beside the earlier ones.
class TensorBoardLog {
public:
  /// `append`: a resumed run, whose file joins the earlier ones. A fresh run
  /// starts the folder's scalars over, as it does a CSV: the event files ptc
  /// wrote there before (`*.ptc`; another writer's stay) are removed, else
  /// TensorBoard would draw both runs as one. `removed` counts them.
  Status open(const std::string &directory, bool append, int *removed = nullptr);
  /// One Event with every present scalar of `row`, tagged "<prefix><name>".
  Status write(int64_t step, const ScalarRow &row, const std::string &prefix = "");
  const std::string &path() const { return path_; }

private:
  Status writeRecord(const std::string &bytes);
  std::string path_;
  std::ofstream out_;
};

} // namespace ptc

#endif // PTC_RUNTIME_IO_SCALAR_LOG_H
