// ptc-tokenize: text -> token files for ptc-run. Bytes (vocabulary 256) or a
// SentencePiece model (Debian's libsentencepiece: unigram or BPE, one trained
// here with --train-sentencepiece); plain text files or JSON lines (one
// document per line, its text under --jsonl-key). Writes nanoGPT's headerless
// uint16 .bin, or ptc's form with a header (runtime/io/token_data.h) and
// uint32 ids when the vocabulary exceeds 65536 (or with --dtype uint32).
//   ptc-tokenize -o corpus.bin file.txt [more.txt ...]
//   ptc-tokenize --train-sentencepiece sp --vocab-size 8000 -o corpus.bin docs.jsonl

#include "runtime/io/token_data.h"

#include <nlohmann/json.hpp>

#ifdef PTC_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {
const char *kUsage =
    R"(usage: ptc-tokenize -o OUT.bin [options] INPUT [INPUT ...]
Tokenizes text files (each one document) and JSON lines files (*.jsonl: one document per line,
its text under --jsonl-key) into one token file for ptc-run --data.
  --sentencepiece MODEL      tokenize with a SentencePiece model (default: bytes, vocabulary 256)
  --train-sentencepiece PREFIX  first train a SentencePiece model on the inputs: PREFIX.model,
                             PREFIX.vocab; then tokenize with it
  --vocab-size N             the trained model's vocabulary (default 8000)
  --model-type T             unigram (default), bpe, char or word
  --jsonl-key KEY            the text field of JSON lines inputs (default "text")
  --append-eos               an end-of-document id after each document (SentencePiece's </s>)
  --dtype uint16|uint32      the ids' width; default uint16 (nanoGPT's headerless .bin) up to a
                             vocabulary of 65536, uint32 (with ptc's header) above
)";

int fail(const std::string &message) {
  std::cerr << "ptc-tokenize: error: " << message << "\n";
  return 1;
}

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The documents of `path`: the whole file, or each JSON line's `key`.
std::optional<std::string> readDocuments(const std::string &path, const std::string &key,
                                         std::vector<std::string> &docs) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return "'" + path + "' is a directory; name the text files in it";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return "cannot open '" + path + "'";
  if (!endsWith(path, ".jsonl")) {
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad())
      return "cannot read '" + path + "'";
    docs.push_back(ss.str());
    return std::nullopt;
  }
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return path + ":" + std::to_string(n) + ": not a JSON object";
    auto it = j.find(key);
    if (it == j.end() || !it->is_string())
      return path + ":" + std::to_string(n) + ": no string field '" + key + "' (--jsonl-key)";
    docs.push_back(it->get<std::string>());
  }
  return std::nullopt;
}

template <typename T> void appendLittleEndian(std::string &out, const std::vector<uint32_t> &ids) {
  for (uint32_t id : ids) {
    T v = static_cast<T>(id);
    out.append(reinterpret_cast<const char *>(&v), sizeof(T));
  }
}
} // namespace

int main(int argc, char **argv) {
  std::string output, spModel, trainPrefix, modelType = "unigram", jsonlKey = "text", dtype;
  int64_t vocabSize = 8000;
  bool appendEos = false;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char *flag) -> std::optional<std::string> {
      if (i + 1 >= argc) {
        std::cerr << "ptc-tokenize: error: " << flag << " needs a value\n";
        return std::nullopt;
      }
      return std::string(argv[++i]);
    };
    std::optional<std::string> v;
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a == "-o" || a == "--sentencepiece" || a == "--train-sentencepiece" ||
               a == "--vocab-size" || a == "--model-type" || a == "--jsonl-key" || a == "--dtype") {
      if (!(v = value(a.c_str())))
        return 2;
      if (a == "-o")
        output = *v;
      else if (a == "--sentencepiece")
        spModel = *v;
      else if (a == "--train-sentencepiece")
        trainPrefix = *v;
      else if (a == "--model-type")
        modelType = *v;
      else if (a == "--jsonl-key")
        jsonlKey = *v;
      else if (a == "--dtype")
        dtype = *v;
      else {
        char *end = nullptr;
        vocabSize = std::strtoll(v->c_str(), &end, 10);
        if (end == v->c_str() || *end || vocabSize < 2 || vocabSize > (int64_t{1} << 31)) {
          std::cerr << "ptc-tokenize: error: --vocab-size expects an integer from 2 to 2^31, got '"
                    << *v << "'\n";
          return 2;
        }
      }
    } else if (a == "--append-eos") {
      appendEos = true;
    } else if (a.rfind("--", 0) == 0) {
      std::cerr << "ptc-tokenize: error: unknown option '" << a << "'\n" << kUsage;
      return 2;
    } else {
      inputs.push_back(a);
    }
  }
  if (output.empty() || inputs.empty()) {
    std::cerr << "ptc-tokenize: error: usage: ptc-tokenize -o OUT.bin INPUT.txt [...]\n";
    return 2;
  }
  if (!spModel.empty() && !trainPrefix.empty())
    return fail("--sentencepiece and --train-sentencepiece both name the model; give one");
  if (!dtype.empty() && dtype != "uint16" && dtype != "uint32")
    return fail("--dtype must be uint16 or uint32, got '" + dtype + "'");
  if (modelType != "unigram" && modelType != "bpe" && modelType != "char" && modelType != "word")
    return fail("--model-type must be unigram, bpe, char or word, got '" + modelType + "'");

  std::vector<std::string> docs;
  for (const std::string &path : inputs)
    if (auto e = readDocuments(path, jsonlKey, docs))
      return fail(*e);
  size_t bytes = 0;
  for (const std::string &d : docs)
    bytes += d.size();
  if (bytes == 0)
    return fail("the input holds no text (0 bytes): nothing to train on");

  std::vector<uint32_t> ids;
  uint64_t vocab = 256;
  std::string what = "bytes";
#ifdef PTC_HAVE_SENTENCEPIECE
  if (!trainPrefix.empty()) {
    // SentencePiece trains on lines: the documents, one file.
    std::string corpus = trainPrefix + ".train.txt";
    {
      std::ofstream out(corpus, std::ios::binary | std::ios::trunc);
      for (const std::string &d : docs)
        out << d << (endsWith(d, "\n") ? "" : "\n");
      if (!out.flush())
        return fail("cannot write '" + corpus + "'");
    }
    std::string args = "--input=" + corpus + " --model_prefix=" + trainPrefix +
                       " --vocab_size=" + std::to_string(vocabSize) + " --model_type=" + modelType +
                       " --character_coverage=1.0 --minloglevel=2";
    auto status = sentencepiece::SentencePieceTrainer::Train(args);
    std::remove(corpus.c_str());
    if (!status.ok())
      return fail("training SentencePiece: " + status.ToString());
    spModel = trainPrefix + ".model";
    std::cout << "ptc-tokenize: trained a SentencePiece " << modelType << " model of "
              << vocabSize << " pieces on " << bytes << " bytes -> " << spModel << "\n";
  }
  if (!spModel.empty()) {
    sentencepiece::SentencePieceProcessor sp;
    if (auto status = sp.Load(spModel); !status.ok())
      return fail("cannot load SentencePiece model '" + spModel + "': " + status.ToString());
    vocab = static_cast<uint64_t>(sp.GetPieceSize());
    if (appendEos && sp.eos_id() < 0)
      return fail("--append-eos: the SentencePiece model '" + spModel + "' has no </s> piece");
    std::vector<int> piece;
    for (const std::string &d : docs) {
      if (auto status = sp.Encode(d, &piece); !status.ok())
        return fail("SentencePiece: " + status.ToString());
      ids.insert(ids.end(), piece.begin(), piece.end());
      if (appendEos)
        ids.push_back(static_cast<uint32_t>(sp.eos_id()));
    }
    what = "SentencePiece '" + spModel + "'";
  }
#else
  if (!spModel.empty() || !trainPrefix.empty())
    return fail("this ptc-tokenize was built without SentencePiece (libsentencepiece-dev)");
#endif
  if (spModel.empty()) {
    if (appendEos)
      return fail("--append-eos: the byte tokenizer has no end-of-document id (use a SentencePiece model)");
    for (const std::string &d : docs)
      for (unsigned char c : d)
        ids.push_back(c);
  }

  const bool wide = dtype == "uint32" || (dtype.empty() && vocab > 65536);
  if (!wide && vocab > 65536)
    return fail("--dtype uint16 cannot hold a vocabulary of " + std::to_string(vocab) + " ids");
  std::string bytesOut;
  if (wide) {
    ptc::TokenFileHeader header;
    header.bytesPerToken = 4;
    header.vocab = vocab;
    header.count = ids.size();
    bytesOut = header.encode();
    appendLittleEndian<uint32_t>(bytesOut, ids);
  } else {
    appendLittleEndian<uint16_t>(bytesOut, ids);
  }
  std::string tmp = output + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(bytesOut.data(), static_cast<std::streamsize>(bytesOut.size()));
  if (!out.flush() || (out.close(), std::rename(tmp.c_str(), output.c_str()) != 0)) {
    std::remove(tmp.c_str());
    return fail("cannot write '" + output + "'");
  }
  std::cout << "ptc-tokenize: " << ids.size() << " tokens from " << inputs.size() << " file(s)";
  if (docs.size() != inputs.size())
    std::cout << " (" << docs.size() << " documents)";
  std::cout << " -> " << output << " (" << (wide ? "uint32 with a header" : "uint16")
            << ", vocabulary " << vocab << ": " << what << ")\n";
  return 0;
}
