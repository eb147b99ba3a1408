// ptc-tokenize: byte-level tokenizer. Turns text files into a nanoGPT-style
// .bin file of little-endian uint16 token ids (one id per byte, vocab 256).
//   ptc-tokenize -o corpus.bin file.txt [more.txt ...]

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  std::string output;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-o" && i + 1 < argc)
      output = argv[++i];
    else if (a == "-h" || a == "--help") {
      std::cout << "usage: ptc-tokenize -o OUT.bin INPUT.txt [INPUT.txt ...]\n"
                   "Writes one uint16 token per input byte (byte-level vocabulary of 256).\n";
      return 0;
    } else
      inputs.push_back(a);
  }
  if (output.empty() || inputs.empty()) {
    std::cerr << "ptc-tokenize: error: usage: ptc-tokenize -o OUT.bin INPUT.txt [...]\n";
    return 2;
  }
  std::vector<uint16_t> tokens;
  for (const std::string &path : inputs) {
    // A directory opens as a stream that reads nothing (it gave 0 tokens).
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      std::cerr << "ptc-tokenize: error: '" << path
                << "' is a directory; name the text files in it\n";
      return 1;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::cerr << "ptc-tokenize: error: cannot open '" << path << "'\n";
      return 1;
    }
    char c;
    while (in.get(c))
      tokens.push_back(static_cast<uint8_t>(c));
    if (in.bad()) {
      std::cerr << "ptc-tokenize: error: cannot read '" << path << "'\n";
      return 1;
    }
  }
  if (tokens.empty()) {
    std::cerr << "ptc-tokenize: error: the input holds no text (0 bytes): nothing to train on\n";
    return 1;
  }
  std::string tmp = output + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  for (uint16_t t : tokens) {
    unsigned char le[2] = {static_cast<unsigned char>(t & 0xff), static_cast<unsigned char>(t >> 8)};
    out.write(reinterpret_cast<const char *>(le), 2);
  }
  if (!out.flush() || (out.close(), std::rename(tmp.c_str(), output.c_str()) != 0)) {
    std::cerr << "ptc-tokenize: error: cannot write '" << output << "'\n";
    return 1;
  }
  std::cout << "ptc-tokenize: " << tokens.size() << " tokens from " << inputs.size()
            << " file(s) -> " << output << "\n";
  return 0;
}
