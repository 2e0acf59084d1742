#pragma once
// The one Catch2 shim: v3 (catch2/catch_all.hpp, GPU machine) or v2 (catch2/catch.hpp, Debian 12).
// Tests include only this header and use REQUIRE/CHECK/SECTION/TEST_CASE and Approx, which both share.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;  // v2 names it Approx at global scope
#else
#include <catch2/catch.hpp>
#endif
