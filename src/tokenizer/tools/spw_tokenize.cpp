// spw-tokenize: the tokenizer from the command line, for tests and benchmarks.
//   spw-tokenize -t tokenizer.json [FILE...]          ids of each file (stdin if none), one line each
//   spw-tokenize -t tokenizer.json --records          stdin holds records "<nbytes>\n<bytes>"; one id line each
//   spw-tokenize -t tokenizer.json --decode           stdin holds id lines; writes records "<nbytes>\n<bytes>"
//   spw-tokenize -t tokenizer.json --engram-map       "n_classes N", then the class of each id, one per line
//   spw-tokenize -t tokenizer.json --bench FILE -n 5  encode FILE n times; JSON with seconds per pass
//                                                     (with --records: FILE holds records, one encode each)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "tokenizer/tokenizer.h"

namespace {

std::string read_all(std::istream& in) {
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

void write_ids(const std::vector<int32_t>& ids, std::string& out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(' ');
    out.append(std::to_string(ids[i]));
  }
  out.push_back('\n');
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Spillway tokenizer tool (Hugging Face tokenizer.json byte-level BPE)"};
  std::string tokenizer_path;
  std::vector<std::string> files;
  bool records = false, decode = false, engram = false, no_special = false, skip_special = false;
  std::string bench_file;
  int repeat = 3;
  app.add_option("-t,--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_option("files", files, "input files (default: stdin)");
  app.add_flag("--records", records, "stdin holds length-prefixed records");
  app.add_flag("--decode", decode, "decode id lines from stdin into length-prefixed records");
  app.add_flag("--skip-special", skip_special, "with --decode: drop special tokens");
  app.add_flag("--no-special", no_special, "encode special tokens as plain text");
  app.add_flag("--engram-map", engram, "print the Engram compressed-token map");
  app.add_option("--bench", bench_file, "time encoding this file");
  app.add_option("-n,--repeat", repeat, "passes for --bench");
  CLI11_PARSE(app, argc, argv);

  auto loaded = spw::Tokenizer::load(tokenizer_path);
  if (!loaded) {
    std::fprintf(stderr, "spw-tokenize: %s\n", loaded.error().message.c_str());
    return 1;
  }
  const spw::Tokenizer& tok = *loaded.value();
  std::ios::sync_with_stdio(false);
  std::string out;

  if (engram) {
    int64_t n_classes = 0;
    const auto map = spw::engram_compressed_token_map(tok, &n_classes);
    out = "n_classes " + std::to_string(n_classes) + "\n";
    for (const int32_t c : map) out.append(std::to_string(c)).push_back('\n');
  } else if (!bench_file.empty()) {
    std::ifstream in(bench_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "spw-tokenize: cannot open %s\n", bench_file.c_str());
      return 1;
    }
    const std::string text = read_all(in);
    // With --records the file holds length-prefixed documents, each encoded on its own.
    std::vector<std::string_view> docs;
    size_t n_bytes = 0;
    if (records) {
      for (size_t pos = 0; pos < text.size();) {
        const size_t nl = text.find('\n', pos);
        const size_t n = std::stoull(text.substr(pos, nl - pos));
        docs.push_back(std::string_view(text).substr(nl + 1, n));
        n_bytes += n;
        pos = nl + 1 + n;
      }
    } else {
      docs.push_back(text);
      n_bytes = text.size();
    }
    out = "{\"bytes\": " + std::to_string(n_bytes) + ", \"documents\": " + std::to_string(docs.size()) + ", \"passes\": [";
    size_t n_ids = 0;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      n_ids = 0;
      for (const std::string_view d : docs) n_ids += tok.encode(d, !no_special).size();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out.append(r ? ", " : "").append(std::to_string(s));
    }
    out.append("], \"ids\": " + std::to_string(n_ids) + "}\n");
  } else if (decode) {
    std::string line;
    std::vector<int32_t> ids;
    while (std::getline(std::cin, line)) {
      ids.clear();
      std::istringstream ls(line);
      int64_t v;
      while (ls >> v) ids.push_back(static_cast<int32_t>(v));
      const std::string text = tok.decode(ids, skip_special);
      out.append(std::to_string(text.size())).push_back('\n');
      out.append(text);
    }
  } else if (records) {
    const std::string in = read_all(std::cin);
    size_t pos = 0;
    while (pos < in.size()) {
      const size_t nl = in.find('\n', pos);
      if (nl == std::string::npos) break;
      const size_t n = std::stoull(in.substr(pos, nl - pos));
      if (nl + 1 + n > in.size()) {
        std::fprintf(stderr, "spw-tokenize: truncated record\n");
        return 1;
      }
      write_ids(tok.encode(std::string_view(in).substr(nl + 1, n), !no_special), out);
      pos = nl + 1 + n;
    }
  } else if (files.empty()) {
    write_ids(tok.encode(read_all(std::cin), !no_special), out);
  } else {
    for (const std::string& f : files) {
      std::ifstream in(f, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "spw-tokenize: cannot open %s\n", f.c_str());
        return 1;
      }
      write_ids(tok.encode(read_all(in), !no_special), out);
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
