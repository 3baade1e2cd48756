#!/bin/bash
# test_layering.sh: the layering rules grep can check, over every source file of the project.
#
#  1. One compile driver. The stages of the compile chain are
#       xt_lower (frontend/), ir_autodiff (ir/), pass_run_pipeline and pass_run_list (passes/),
#       cg_compile (codegen/);
#     only driver/ calls more than one of them. Outside its own layer and driver/, a file may call
#     one stage (a unit test of that layer: test_passes on IR text, test_autodiff on built
#     graphs, op_cases.h building a backward graph); cli/ calls none (every command goes through
#     drv_run). A file that strings two together is writing the chain out again.
#  2. No source file (*.c, *.h, *.y, *.l) over 1,200 lines.
#
# Comments are stripped first, so a comment naming a stage is not a call.
# usage: test_layering.sh BUILD_DIR SOURCE_DIR
src=${2:?usage: test_layering.sh BUILD_DIR SOURCE_DIR}
cd "$src" || exit 1
# one perl pass over every file: sizes, then the stages each calls outside their own layer
check='
    my %home = (xt_lower => "frontend", ir_autodiff => "ir", pass_run_pipeline => "passes",
                pass_run_list => "passes", cg_compile => "codegen");
    my $fail = 0;
    for my $f (@ARGV) {
        open(my $fh, "<", $f) or die "$f: $!";
        local $/;
        my $text = <$fh>;
        my $lines = ($text =~ tr/\n//);
        if ($lines > 1200) {
            print "FAIL size: $f has $lines lines (at most 1,200: split it by job)\n";
            $fail = 1;
        }
        next if $f =~ m{^driver/};
        $text =~ s{/\*.*?\*/}{}gs;
        $text =~ s{//[^\n]*}{}g;
        my (%layers, @calls);
        for my $s (sort keys %home) {
            next if index($f, "$home{$s}/") == 0;
            if ($text =~ /(?<![A-Za-z0-9_])\Q$s\E\s*\(/) {
                $layers{$home{$s}} = 1;
                push @calls, $s;
            }
        }
        my $n = keys %layers;
        if ($f =~ m{^cli/} && $n > 0) {
            print "FAIL driver: $f calls @calls itself; the commands go through drv_run (driver/driver.h)\n";
            $fail = 1;
        } elsif ($n > 1) {
            print "FAIL driver: $f strings together @calls; the chain is drv_run (driver/driver.h)\n";
            $fail = 1;
        }
    }
    exit $fail;
'
folders="cli driver frontend ir passes codegen runtime tests bench examples tools include"
files=$(for d in $folders; do [ -d "$d" ] && find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.y' -o -name '*.l' \); done | sort)
[ -n "$files" ] || { echo "FAIL: no source files under $src"; exit 1; }
nfiles=$(wc -w <<< "$files")
fail=0
# shellcheck disable=SC2086
perl -e "$check" $files || fail=1

# the check itself must see violations: a scratch tree with a cli file calling one stage, a test
# chaining two (one only in a comment, which does not count), and a file of 1,201 lines
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
mkdir -p "$probe/cli" "$probe/tests"
printf 'int c(void) { return cg_compile(g, &o, 0, e, 9); }\n' > "$probe/cli/c.c"
printf 'void f(void) {\n    /* ir_autodiff(x) */\n    g = xt_lower(f, 0, 0, d);\n    pass_run_pipeline (g, 0, e, 9);\n}\n' > "$probe/tests/t.c"
printf 'void f(void) {\n    /* ir_autodiff(x) */\n    g = xt_lower(f, 0, 0, d);\n}\n' > "$probe/tests/one.c"
seq 1201 | sed 's|.*|/* & */|' > "$probe/tests/long.h"
got=$(cd "$probe" && perl -e "$check" cli/c.c tests/t.c tests/one.c tests/long.h)
want="FAIL driver: cli/c.c calls cg_compile itself; the commands go through drv_run (driver/driver.h)
FAIL driver: tests/t.c strings together pass_run_pipeline xt_lower; the chain is drv_run (driver/driver.h)
FAIL size: tests/long.h has 1201 lines (at most 1,200: split it by job)"
if [ "$got" != "$want" ]; then
    echo "FAIL self-check: on the probe files the check said:"
    echo "$got" | sed 's/^/    /'
    fail=1
fi

[ "$fail" -eq 0 ] && echo "ok: $nfiles source files, none over 1,200 lines; only driver/ chains the stages"
exit $fail
