"""What a user's file pays to include accel: compiler CPU time (user + system, the compiler's own process) of
programs written with accel against the same programs written with LibTorch alone, compiled in pairs in each round
(the order alternating), at -O2, with the flags of the benchmark build; medians over the rounds, and the median of
each round's ratio. Run by `scripts/bench.sh compile` (docs/performance.md).

    compile_times.py BUILD_DIR ROUNDS [--headers] [--cumulative] [--suite SOURCE_DIR]

--headers   also each public header alone (-fsyntax-only, header-only and compiled modes)
--cumulative  also what each header of accel.hpp adds, in its order, after torch/torch.h and the headers before it:
            the compiler's total allocation (-ftime-report's GGC total, deterministic), -fsyntax-only, compiled mode
--suite     also a clean build of the test suite with the compiler cache off (the sum of its compile times, from
            ninja's log) and the rebuild after touching include/accel/tracking.hpp, in a new directory under BUILD_DIR
"""
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time


def compile_command(build, source):
    """The compiler and its arguments for `source` in `build`, without the compiler cache, at -O2, writing nothing."""
    entries = json.load(open(os.path.join(build, 'compile_commands.json')))
    for entry in entries:
        if entry['file'].endswith(source):
            words = shlex.split(entry['command'])
            # ccache as CMake's launcher: `cmake -E env VAR=... ccache compiler ...`
            compiler = next(i for i, w in enumerate(words) if re.search(r'(^|/)(c\+\+|g\+\+|clang\+\+)[-0-9.]*$', w))
            words = words[compiler:]
            out = words.index('-o')
            del words[out:out + 2]
            words = [w for w in words if not re.fullmatch(r'-O[0-3s]', w)] + ['-O2', '-o', '/dev/null']
            return words, entry['directory']
    sys.exit('compile_times.py: %s is not in %s/compile_commands.json; configure with -DACCEL_BUILD_BENCHMARKS=ON'
             % (source, build))


def cpu_seconds(words, directory):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(words, cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit('compile_times.py: compiling failed:\n%s\n%s' % (' '.join(words), result.stderr[-3000:]))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def syntax_only(words, source_text, directory):
    """`words` (a compile command) on a file holding `source_text`, -fsyntax-only."""
    handle, path = tempfile.mkstemp(suffix='.cpp')
    with os.fdopen(handle, 'w') as f:
        f.write(source_text)
    command = [w for w in words if w not in ('-o', '/dev/null', '-c')]
    command = [w for w in command if not w.endswith('.cpp')] + ['-fsyntax-only', path]
    try:
        return cpu_seconds(command, directory)
    finally:
        os.unlink(path)


def paired(name, accel_run, peer_run, rounds):
    accel, peer, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            a, p = accel_run(), peer_run()
        else:
            p, a = peer_run(), accel_run()
        accel.append(a)
        peer.append(p)
        ratios.append(a / p)
    row = (name, statistics.median(accel), statistics.median(peer), statistics.median(ratios))
    print('| %s | %.1f | %.1f | %.2fx |' % row, flush=True)
    return row


def headers(build, words, directory):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'include')
    names = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(os.path.join(root, 'accel'))
                   for f in fs if f.endswith('.hpp') and '/detail/' not in os.path.join(d, f) + '/')
    print('\n| header alone (-fsyntax-only) | header-only s | compiled s |\n|---|---|---|')
    header_only = [w for w in words if w != '-DACCEL_SEPARATE_COMPILATION']
    for name in names:
        text = '#include <%s>\n' % name
        print('| %s | %.1f | %.1f |' % (name, syntax_only(header_only, text, directory),
                                         syntax_only(words, text, directory)), flush=True)


def allocated_mb(words, source_text, directory):
    """The compiler's total allocation (MB) for `source_text`, -fsyntax-only, from -ftime-report's TOTAL line."""
    handle, path = tempfile.mkstemp(suffix='.cpp')
    with os.fdopen(handle, 'w') as f:
        f.write(source_text)
    command = [w for w in words if w not in ('-o', '/dev/null', '-c') and not w.endswith('.cpp')]
    try:
        result = subprocess.run(command + ['-fsyntax-only', '-ftime-report', path], cwd=directory,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    finally:
        os.unlink(path)
    total = re.search(r'^ TOTAL\s*:.*?(\d+)([kMG])\s*$', result.stderr, re.M)
    return int(total.group(1)) * {'k': 1 / 1024, 'M': 1, 'G': 1024}[total.group(2)]


def cumulative(words, directory):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'include', 'accel')
    names = re.findall(r'^#include "(.+)"', open(os.path.join(root, 'accel.hpp')).read(), re.M)
    text = '#include <torch/torch.h>\n'
    before = allocated_mb(words, text, directory)
    print('\n| accel.hpp\'s headers in order, after torch/torch.h (%d MB), compiled mode | MB in all | MB added |'
          % before)
    print('|---|---|---|')
    for name in names:
        text += '#include <accel/%s>\n' % name
        now = allocated_mb(words, text, directory)
        print('| %s | %d | %+d |' % (name, now, now - before), flush=True)
        before = now


def ninja_compile_seconds(build):
    """Summed compile time of the last build in `build` (ninja's log: start and end of each step, in ms)."""
    total, seen = 0, {}
    for line in open(os.path.join(build, '.ninja_log')):
        if line.startswith('#'):
            continue
        start, end, _, output, _ = line.rstrip('\n').split('\t')
        seen[output] = (int(end) - int(start)) / 1000
    for output, seconds in seen.items():
        if output.endswith('.o') or output.endswith('.gch'):
            total += seconds
    return total, seen


def suite(build, source):
    suite_build = os.path.join(build, 'suite')
    env = dict(os.environ, CCACHE_DISABLE='1')
    cache = open(os.path.join(build, 'CMakeCache.txt')).read()
    prefix = re.search(r'^CMAKE_PREFIX_PATH:\w+=(.*)$', cache, re.M)
    python = re.search(r'^ACCEL_PYTHON:\w+=(.*)$', cache, re.M)
    configure = ['cmake', '-S', source, '-B', suite_build, '-G', 'Ninja', '-DCMAKE_BUILD_TYPE=Release',
                 '-DACCEL_BUILD_TESTS=ON', '-DACCEL_BUILD_EXAMPLES=ON']
    if prefix:
        configure.append('-DCMAKE_PREFIX_PATH=' + prefix.group(1))
    if python:
        configure.append('-DACCEL_PYTHON=' + python.group(1))
    subprocess.run(configure, check=True, env=env, stdout=subprocess.DEVNULL)
    if os.path.exists(os.path.join(suite_build, '.ninja_log')):
        subprocess.run(['ninja', '-C', suite_build, 'clean'], check=True, env=env, stdout=subprocess.DEVNULL)
        os.unlink(os.path.join(suite_build, '.ninja_log'))
    started = time.time()
    subprocess.run(['ninja', '-C', suite_build, '-j2'], check=True, env=env, stdout=subprocess.DEVNULL)
    clean_wall = time.time() - started
    clean, _ = ninja_compile_seconds(suite_build)
    os.unlink(os.path.join(suite_build, '.ninja_log'))
    os.utime(os.path.join(source, 'include', 'accel', 'tracking.hpp'))
    subprocess.run(['ninja', '-C', suite_build, '-j2'], check=True, env=env, stdout=subprocess.DEVNULL)
    touched, steps = ninja_compile_seconds(suite_build)
    print('\n| the test suite, compiler cache off | seconds |\n|---|---|')
    print('| clean build: summed compile time | %.0f |' % clean)
    print('| clean build: wall time, -j2 | %.0f |' % clean_wall)
    print('| after touching tracking.hpp: summed compile time | %.0f (%.1f%% of the clean build; %d steps) |'
          % (touched, 100 * touched / clean, len(steps)))


def main():
    build, rounds = sys.argv[1], int(sys.argv[2])
    programs = {name: compile_command(build, 'bench/compile/%s.cpp' % name)
                for name in ('readme_accel', 'readme_torch', 'dp_accel', 'dp_torch')}
    header_only = {name: compile_command(build, 'bench/compile/%s_header_only.cpp' % name)
                   for name in ('readme_accel', 'dp_accel')}
    print('| program (-O2, compiler CPU s, median of %d) | accel | LibTorch alone | ratio |' % rounds)
    print('|---|---|---|---|')
    run = lambda entry: (lambda: cpu_seconds(*entry))
    paired('README program, accel.hpp, compiled mode', run(programs['readme_accel']), run(programs['readme_torch']),
           rounds)
    paired('README program, accel.hpp, header-only', run(header_only['readme_accel']),
           run(programs['readme_torch']), rounds)
    paired('bf16 data_parallel<gloo> loop, accelerator.hpp, compiled mode', run(programs['dp_accel']),
           run(programs['dp_torch']), rounds)
    paired('bf16 data_parallel<gloo> loop, accelerator.hpp, header-only', run(header_only['dp_accel']),
           run(programs['dp_torch']), rounds)
    words, directory = programs['readme_accel']
    header_only_words = [w for w in words if w != '-DACCEL_SEPARATE_COMPILATION']
    paired('accel.hpp alone against torch/torch.h alone (-fsyntax-only), compiled mode',
           lambda: syntax_only(words, '#include <accel/accel.hpp>\n', directory),
           lambda: syntax_only(words, '#include <torch/torch.h>\n', directory), rounds)
    paired('accel.hpp alone against torch/torch.h alone (-fsyntax-only), header-only',
           lambda: syntax_only(header_only_words, '#include <accel/accel.hpp>\n', directory),
           lambda: syntax_only(words, '#include <torch/torch.h>\n', directory), rounds)
    if '--headers' in sys.argv:
        headers(build, words, directory)
    if '--cumulative' in sys.argv:
        cumulative(words, directory)
    if '--suite' in sys.argv:
        suite(build, sys.argv[sys.argv.index('--suite') + 1])


if __name__ == '__main__':
    main()
