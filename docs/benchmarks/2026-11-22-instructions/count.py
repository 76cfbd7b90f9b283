"""Per-request counts from a callgrind dump made with --dump-instr=yes.

    python3 count.py DUMP REQUESTS LOCKS OBJECT

Prints instructions per request, the functions with the most (self cost), and how many
lock-prefixed instructions (atomic read-modify-writes: `lock ...`, `xchg` with memory)
ran per request, by function. LOCKS lists their addresses in OBJECT (`objdump -d`).
"""
import collections
import re
import sys

dump, requests, locks_file, object_name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
locks = {}
for line in open(locks_file):
    address, function = line.split(' ', 1)
    locks[int(address, 16)] = function.strip()

names, objects = {}, {}
self_cost = collections.Counter()
atomics = collections.Counter()
function = obj = None
address = 0
after_calls = False


def compressed(token, table):
    m = re.match(r'\((\d+)\)(?: (.*))?', token)
    if not m:
        return token
    if m.group(2):
        table[m.group(1)] = m.group(2)
    return table.get(m.group(1), token)


def position(token, current):
    if token.startswith('0x'):
        return int(token, 16)
    if token[0] in '+-':
        return current + int(token)
    if token == '*':
        return current
    return int(token)


for line in open(dump, errors='replace'):
    line = line.rstrip('\n')
    if line.startswith('ob='):
        obj = compressed(line[3:], objects)
    elif line.startswith('cob='):
        compressed(line[4:], objects)
    elif line.startswith('fn='):
        function = compressed(line[3:], names)
    elif line.startswith('cfn='):
        compressed(line[4:], names)
    elif line.startswith('calls='):
        after_calls = True
    elif line and (line[0].isdigit() or line[0] in '+-*'):
        parts = line.split()
        address = position(parts[0], address)
        if after_calls:  # the inclusive cost of a call: not this function's own
            after_calls = False
            continue
        cost = int(parts[-1])
        self_cost[function] += cost
        if obj and obj.endswith('/' + object_name) and address in locks:
            atomics[locks[address]] += cost

total = sum(self_cost.values())
print(f"instructions per request: {total / requests:.0f} ({requests} requests)")
for name, cost in self_cost.most_common(25):
    print(f"  {cost / requests:7.0f}  {name[:110]}")
print(f"atomic read-modify-writes per request: {sum(atomics.values()) / requests:.1f}")
for name, count in atomics.most_common(20):
    if count / requests >= 0.05:
        print(f"  {count / requests:6.2f}  {name[:110]}")
