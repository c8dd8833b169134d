# The recipes' shared steps (sourced by backtranslation.sh, distill.sh and multilingual.sh):
# each command is printed, and in a dry run (DRY non-empty) validated with --cfg job, not run.

words() {  # words ARG...: the arguments as one shell command line, quoted where needed
  local out=() a
  for a in "$@"; do
    if [[ $a =~ ^[][A-Za-z0-9_./=:+,@%-]+$ ]]; then out+=("$a")
    elif [[ $a =~ [\$\`\"\\] ]]; then out+=("$(printf %q "$a")")
    else out+=("\"$a\""); fi
  done
  echo "${out[*]}"
}

step() {  # step NAME COMMAND...: run it, or in a dry run print it and validate its config
  local name=$1; shift
  echo "+ $(words "$@")" >&2
  if [ -n "$DRY" ]; then
    echo "### $name"
    "$@" --cfg job
  else
    "$@"
  fi
}

shell() {  # shell COMMAND: a shell command line, run unless this is a dry run
  echo "+ $1" >&2
  [ -n "$DRY" ] || bash -c "$1"
}
