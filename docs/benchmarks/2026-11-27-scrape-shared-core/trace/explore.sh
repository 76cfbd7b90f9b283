#!/bin/bash
# One exploration run: the lab scenario under perf sched record, with a /proc sampler.
set -u
name=$1; bin=$2; scen=$3
cd /work/wt/scrape
/tmp/scrape-ev/sample.sh /tmp/scrape-ev/$name-samples.txt &
sampler=$!
perf sched record -a -o /tmp/scrape-ev/$name.data -- $bin lab $scen --out /tmp/scrape-ev/$name --nice -10 > /tmp/scrape-ev/$name.out 2>&1
kill $sampler
