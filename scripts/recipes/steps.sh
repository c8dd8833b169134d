# The recipes' shared helpers (sourced by backtranslation.sh, distill.sh and multilingual.sh):
# corpus files (compressed or not), and steps: each command is printed, and in a dry run (DRY
# non-empty) validated with --cfg job, not run.

corpus_file() {  # corpus_file PATH: PATH, or PATH.xz / .gz / .bz2 (the bundled corpus is xz)
  local ext
  for ext in "" .xz .gz .bz2; do
    [ -f "$1$ext" ] && { echo "$1$ext"; return; }
  done
  echo "$1"
}

text() {  # text PATH: the command that prints a (compressed) corpus file
  case "$1" in
    *.xz) echo "xz -dc $(q "$1")" ;; *.gz) echo "gzip -dc $(q "$1")" ;;
    *.bz2) echo "bzip2 -dc $(q "$1")" ;; *) echo "cat $(q "$1")" ;;
  esac
}

q() {  # q PATH: quoted for a shell command line
  printf %q "$1"
}

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
