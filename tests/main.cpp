// Shared main for every test executable (works with Catch2 v2 and v3).
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif
int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
