# Sourced by the bench/h200_*.sh device scripts: the missing pure-Python wheels from $WHEELS
# (default ../whl) go to /tmp/site, and this checkout joins PYTHONPATH.
wheels=${WHEELS:-../whl}
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$wheels"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
