// edge-run: the native runner's command line, on the C API alone.
//   edge-run ARTIFACT --inputs in.npz --out out.npz [--public-key signing.pub] [--json]
// Prints one `error:` paragraph (or one JSON object with --json) and exits with the
// runtime's code: 2 bad artifact, input or usage; 1 a backend failed; 4 a bug.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "edge_runtime.h"

namespace {

const char* const kUsage =
    "usage: edge-run ARTIFACT --inputs IN.npz --out OUT.npz [--public-key signing.pub] [--json]";

struct Args {
  const char* artifact = nullptr;
  const char* inputs = nullptr;
  const char* out = nullptr;
  const char* public_key = nullptr;
  bool json = false;
};

std::string json_string(const char* text) {
  std::string out = "\"";
  for (const char* p = text; *p; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += *p;
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += *p;
    }
  }
  return out + "\"";
}

int fail(const Args& args) {
  if (args.json) {
    std::printf("{\"error\": %s}\n", edge_last_error_json());
  } else {
    std::fprintf(stderr, "error: %s\n", edge_last_error());
  }
  return edge_last_exit_code();
}

int usage_error(const Args& args, const std::string& what) {
  const std::string message = what + ".\nTry: " + kUsage;
  if (args.json) {
    std::printf("{\"error\": {\"type\": \"UserInputError\", \"exit_code\": 2, \"message\": %s, "
                "\"what\": %s, \"where\": null, \"hint\": %s, \"details\": []}}\n",
                json_string(message.c_str()).c_str(), json_string(what.c_str()).c_str(),
                json_string(kUsage).c_str());
  } else {
    std::fprintf(stderr, "error: %s\n", message.c_str());
  }
  return 2;
}

// Returns "" or why --out must not be written: not a regular file, or a file this run reads.
std::string out_problem(const Args& args) {
  struct stat out {}, read {};
  if (::stat(args.out, &out) != 0) return "";
  if (!S_ISREG(out.st_mode)) return std::string("--out ") + args.out + " is not a regular file; only a regular file is ever replaced";
  for (const char* path : {args.artifact, args.inputs}) {
    if (::stat(path, &read) == 0 && read.st_dev == out.st_dev && read.st_ino == out.st_ino) {
      return std::string("--out ") + args.out + " is " + path + ", which this run reads; writing would replace it";
    }
  }
  return "";
}

// Returns "" or what is wrong with the command line.
std::string parse(int argc, char** argv, Args& args) {
  for (int i = 1; i < argc; ++i) args.json = args.json || std::strcmp(argv[i], "--json") == 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char*& slot) {
      if (i + 1 >= argc) return false;
      slot = argv[++i];
      return true;
    };
    if (arg == "--json") {
      args.json = true;
    } else if (arg == "--inputs" || arg == "--out" || arg == "--public-key") {
      const char*& slot = arg == "--inputs" ? args.inputs : arg == "--out" ? args.out : args.public_key;
      if (!value(slot)) return arg + " needs a value";
    } else if (arg == "-h" || arg == "--help") {
      return "help";
    } else if (arg.rfind("-", 0) == 0 || args.artifact) {
      return "unexpected argument '" + arg + "'";
    } else {
      args.artifact = argv[i];
    }
  }
  if (!args.artifact) return "no artifact given";
  if (!args.inputs) return "no --inputs file given";
  if (!args.out) return "no --out file given";
  return "";
}

void describe(const edge_tensor& t, std::string& text, bool json) {
  std::string shape;
  for (int32_t i = 0; i < t.rank; ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  if (json) {
    text += std::string(text.empty() ? "" : ", ") + "{\"name\": " + json_string(t.name) +
            ", \"dtype\": " + json_string(t.dtype) + ", \"shape\": [" + shape + "]}";
  } else {
    text += std::string("  ") + t.name + ": " + t.dtype + "[" + shape + "]\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  const std::string problem = parse(argc, argv, args);
  if (problem == "help") {
    std::printf("%s\n", kUsage);
    return 0;
  }
  if (!problem.empty()) return usage_error(args, problem);
  const std::string refused = out_problem(args);
  if (!refused.empty()) return usage_error(args, refused);
  edge_program* program = nullptr;
  if (edge_load(args.artifact, args.public_key, &program) != 0) return fail(args);
  edge_outputs* inputs = nullptr;
  edge_outputs* outputs = nullptr;
  int code = edge_read_arrays(args.inputs, program, &inputs);
  if (code == 0) {
    std::vector<edge_tensor> given;
    for (size_t i = 0; i < edge_outputs_count(inputs); ++i) given.push_back(*edge_outputs_get(inputs, i));
    code = edge_run(program, given.data(), given.size(), &outputs);
  }
  std::vector<edge_tensor> results;
  for (size_t i = 0; code == 0 && i < edge_outputs_count(outputs); ++i) {
    results.push_back(*edge_outputs_get(outputs, i));
  }
  if (code == 0) code = edge_write_npz(args.out, results.data(), results.size());
  if (code != 0) {
    code = fail(args);
  } else {
    std::string text;
    for (const auto& t : results) describe(t, text, args.json);
    if (args.json) {
      std::printf("{\"artifact\": %s, \"out\": %s, \"outputs\": [%s]}\n", json_string(args.artifact).c_str(),
                  json_string(args.out).c_str(), text.c_str());
    } else {
      std::printf("wrote %s:\n%s", args.out, text.c_str());
    }
  }
  edge_outputs_free(outputs);
  edge_outputs_free(inputs);
  edge_free(program);
  return code;
}
