#!/usr/bin/env bash
# The GPU tests find their golden fixtures under the source path compiled into them (SPW_SOURCE_DIR, the
# checkout they were built in). On the GPU machine the checkout lives elsewhere, and without the link
# every test that reads a fixture fails. `gpu_test.sh stage`
# records the build's source path in .exl3dev/source_dir; this links that path to this checkout when it
# does not exist here. Sourced (or run) from the repository root by the device scripts.
if [ -f .exl3dev/source_dir ]; then
  spw_src=$(cat .exl3dev/source_dir)
  if [ -n "$spw_src" ] && [ ! -e "$spw_src" ]; then
    mkdir -p "$(dirname "$spw_src")" && ln -sfn "$PWD" "$spw_src" && echo "linked $spw_src -> $PWD (the tests' fixture path)"
  fi
fi
