# Sourced on a bare GPU box from an rl_speed checkout: installs the wheel folders named in BOX_WHEELS (default
# ".ray_kit .whl": Ray's kit from make_ray_kit.sh, ale-py and the like for the box's Python) into BOX_SITE once, and
# sets up what the documented GPU figures assume: Python's bytecode cached (BOX_PYCACHE; the box's Python writes
# none by default, and every process would compile its imports again) and an `rl-speed` command.
# BOX_PYTHON (default python3) installs them. Returns non-zero, naming what is missing, when a wheel folder has no
# wheels or the install fails.
BOX_SITE=${BOX_SITE:-/tmp/site}
BOX_PYCACHE=${BOX_PYCACHE:-/tmp/pycache}
BOX_BIN=${BOX_BIN:-/tmp/bin}
box_setup() {
  local wheels=() dir
  for dir in ${BOX_WHEELS-.ray_kit .whl}; do
    if ! compgen -G "$dir/*.whl" > /dev/null; then
      echo "box setup: no wheels in '$dir' (from $PWD); download them into it first (see benchmarks/box/queue.sh)" >&2
      return 1
    fi
    wheels+=("$dir"/*.whl)
  done
  if [ ${#wheels[@]} -gt 0 ] && [ ! -f "$BOX_SITE/.installed" ]; then
    ${BOX_PYTHON:-python3} -m pip install -q --no-index --no-deps --no-compile --target "$BOX_SITE" "${wheels[@]}" || {
      echo "box setup: pip could not install ${wheels[*]} into $BOX_SITE" >&2; return 1; }
    touch "$BOX_SITE/.installed"
  fi
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX=$BOX_PYCACHE PYTHONUNBUFFERED=1
  mkdir -p "$BOX_BIN"
  local cli="'import sys; from rl_speed.cli.main import main; sys.argv[0] = \"rl-speed\"; sys.exit(main())'"
  printf '#!/bin/bash\nexec python3 -c %s "$@"\n' "$cli" > "$BOX_BIN/rl-speed"
  chmod +x "$BOX_BIN/rl-speed"
  export PATH=$BOX_BIN:$PATH
}
box_setup
