#!/usr/bin/env bash
# A = main 0d048c6 kernels (build 12ee312) (whole bundle .device/new.txz), B = variant $1 (branch block-skinny): B's check of
# block_linear and the steps, B's bench of block_linear against its cuBLAS peer, the A/B (A B A B) of the
# projections at B=1 and 4 and of the B <= 4 steps, the four sanitizers on B over block_linear.
set -u
root=$PWD
mkdir -p /tmp/a /tmp/b && tar xJf .device/new.txz -C /tmp/a && tar xJf .device/$1.txz -C /tmp/b
rm -rf /tmp/bb && cp -r /tmp/a/bundle /tmp/bb && cp -r --remove-destination /tmp/b/bundle-variant/. /tmp/bb/
cd /tmp/bb && bin/kvbench --version
bin/kvbench check --determinism block_linear decode_step --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: $(tail -1 $OUT/b_check.log)"
bin/kvbench bench "block_linear B=1 " "block_linear B=4 " --json $OUT/b_peers.json > $OUT/b_peers.log 2>&1; echo "peers B rc=$?"; grep -E "block_linear" $OUT/b_peers.log | cut -c1-200
cd /tmp/a/bundle
KVB_CASES=$root/.device/ab9cases AB_REPEATS=2 bash ab_round.sh $OUT/ab /tmp/b/bundle-variant
cat $OUT/ab/compare_*.txt | cut -c1-230
cd /tmp/bb && SANITIZE_PARALLEL=1 bash sanitize.sh $OUT/san block_linear > $OUT/san.log 2>&1; echo "sanitize rc=$?"; tail -4 $OUT/san.log
cd $OUT && rm -rf ab/b_bundle && tar czf ab.tgz ab san san.log b_check.json b_check.log b_peers.json b_peers.log && rm -rf ab san san.log b_check.json b_check.log b_peers.json b_peers.log
