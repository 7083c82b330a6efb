// The `vericache` command line: one executable, one subcommand per job.
#include <iostream>
#include <string>
#include <vector>

#include "services/cli/demo_command.h"
#include "services/cli/generate_command.h"
#include "services/cli/request_command.h"
#include "services/cli/router_command.h"
#include "services/cli/size_tiers_command.h"
#include "services/cli/stats_command.h"
#include "services/cli/store_command.h"
#include "services/cli/tokenize_command.h"
#include "services/cli/worker_command.h"

namespace {

constexpr char kUsage[] =
    "usage: vericache <command> [options]\n"
    "commands:\n"
    "  generate   generate text from a checkpoint (vericache generate --help)\n"
    "  demo       requests with a shared code prefix through the VeriCache engine, checked against\n"
    "             full-KV decoding (vericache demo --help)\n"
    "  store      run a cache-store server (vericache store --help)\n"
    "  worker     run an inference worker (vericache worker --help)\n"
    "  router     run a router in front of several workers (vericache router --help)\n"
    "  request    send one request to a worker (vericache request --help)\n"
    "  stats      what a running worker or cache store reports of itself (vericache stats --help)\n"
    "  size-tiers replay a request trace through the store's tiers at several sizes, to size them\n"
    "             (vericache size-tiers --help)\n"
    "  tokenize   text to token ids, or back, with a checkpoint's tokenizer (vericache tokenize --help)\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "generate") return vc::cli::RunGenerateCommand(args, std::cout, std::cerr);
  if (cmd == "demo") return vc::cli::RunDemoCommand(args, std::cout, std::cerr);
  if (cmd == "store") return vc::cli::RunStoreCommand(args, std::cout, std::cerr);
  if (cmd == "worker") return vc::cli::RunWorkerCommand(args, std::cout, std::cerr);
  if (cmd == "router") return vc::cli::RunRouterCommand(args, std::cout, std::cerr);
  if (cmd == "request") return vc::cli::RunRequestCommand(args, std::cout, std::cerr);
  if (cmd == "stats") return vc::cli::RunStatsCommand(args, std::cout, std::cerr);
  if (cmd == "size-tiers") return vc::cli::RunSizeTiersCommand(args, std::cout, std::cerr);
  if (cmd == "tokenize") return vc::cli::RunTokenizeCommand(args, std::cout, std::cerr);
  std::cerr << "vericache: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}
