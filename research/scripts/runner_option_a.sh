#!/usr/bin/env bash
# Option (a), for comparison only: hyflash-run linked against the wheel's own LLM kernel library
# (executorch/extension/llm/custom_ops/libcustom_ops_aot_lib.so) instead of runtime_cpp's kernels. That
# library is built against libtorch and the Python extension _C, so the program also needs torch's
# libraries (torch/lib: ~450 MB) and libpython at run time. Builds build/runtime_cpp_a/hyflash-run-a
# from the objects of `make runner`.
set -euo pipefail
cd "$(dirname "$0")/../.."
make runner > /dev/null
SP=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
ET=$SP/executorch
PYLIB=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))")
PYVER=$(.venv/bin/python -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
mkdir -p build/runtime_cpp_a
g++ -O2 -std=c++17 -DHYFLASH_PTE_KERNELS='"executorch"' -DC10_USING_CUSTOM_GENERATED_MACROS -DET_EVENT_TRACER_ENABLED -Wno-deprecated-declarations \
  -I"$ET/include" -I"$ET/include/executorch/runtime/core/portable_type/c10" -Iruntime_cpp/src \
  runtime_cpp/src/main.cc build/runtime_cpp/libhyflash_runtime.a -o build/runtime_cpp_a/hyflash-run-a \
  -Wl,--no-as-needed "$ET/extension/llm/custom_ops/libcustom_ops_aot_lib.so" \
  "$ET/lib/libexecutorch_backend_xnnpack.so" "$ET/lib/libexecutorch_kernels_optimized.so" \
  "$ET/lib/libexecutorch_kernels_quantized.so" "$ET/lib/libexecutorch_threadpool.so" "$ET/lib/libexecutorch.so" \
  -L"$SP/torch/lib" -ltorch -ltorch_cpu -lc10 -L"$PYLIB" -lpython"$PYVER" -Wl,--as-needed \
  -Wl,-rpath,"$ET/lib:$ET/extension/llm/custom_ops:$ET/extension/pybindings:$SP/torch/lib:$PYLIB"
echo build/runtime_cpp_a/hyflash-run-a
