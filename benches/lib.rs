//! tollgate's benchmarks (`core`, `memory`, `middleware`, `inflight`, `redis`,
//! `market_open`) and the `load_server` example the HTTP scripts under `bench/` drive. The
//! library itself is empty: the package exists so that the benchmarks build tollgate as
//! users do. See `bench/README.md`.
