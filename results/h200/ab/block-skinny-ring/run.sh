#!/usr/bin/env bash
# A = main 0d048c6 kernels (build 12ee312) (.device/new.txz); B = v10 (block-skinny: bulk-copy ring, launched chained), C = v11 (the
# same kernel launched plainly): B's check of block_linear and the steps, B's and C's bench of block_linear with the
# cuBLAS peer, A/B and A/C (A B A B) of the projections at B=1 and 4 and the B=1 steps, the sanitizers on B.
set -u
root=$PWD
mkdir -p /tmp/a /tmp/b /tmp/c && tar xJf .device/new.txz -C /tmp/a && tar xJf .device/v1011.txz -C /tmp/b && mkdir -p /tmp/c/bundle-variant && cp -r /tmp/b/bundle-variant/. /tmp/c/bundle-variant/ && cp /tmp/b/v11/lib/libkvbench.so /tmp/c/bundle-variant/lib/
rm -rf /tmp/bb && cp -r /tmp/a/bundle /tmp/bb && cp -r --remove-destination /tmp/b/bundle-variant/. /tmp/bb/
cd /tmp/bb && bin/kvbench --version
bin/kvbench check --determinism block_linear decode_step --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: $(tail -1 $OUT/b_check.log)"
bin/kvbench bench block_linear --json $OUT/b_peers.json > $OUT/b_peers.log 2>&1; echo "peers B rc=$?"; grep -E "^\| .block_linear B=(1|4) " $OUT/b_peers.log | cut -c1-200
cd /tmp/a/bundle
KVB_CASES=$root/.device/ab9cases AB_REPEATS=2 bash ab_round.sh $OUT/ab /tmp/b/bundle-variant
cat $OUT/ab/compare_*.txt | cut -c1-160
KVB_CASES=$root/.device/ab9cases AB_REPEATS=1 bash ab_round.sh $OUT/ac /tmp/c/bundle-variant
cat $OUT/ac/compare_*.txt | cut -c1-160
cd /tmp/bb && SANITIZE_PARALLEL=1 bash sanitize.sh $OUT/san block_linear > $OUT/san.log 2>&1; echo "sanitize rc=$?"; tail -4 $OUT/san.log
cd $OUT && rm -rf ab/b_bundle ac/b_bundle && tar czf ab.tgz ab ac san san.log b_check.json b_check.log b_peers.json b_peers.log && rm -rf ab ac san san.log b_check.json b_check.log b_peers.json b_peers.log
