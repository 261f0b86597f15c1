# decode_step stage breakdown: stacked bars of the four stage groups per case, from the
# stages.dat that harness/report/step_report.py writes (a quoted label, then norms, projections,
# rope+silu, attention in us).
#   gnuplot -e "datafile='results/.../stages.dat'; outfile='results/.../stages.png'; gpu='H200'" harness/report/step_stages.gp
# (`make step-report STEP_RESULTS=... GPU=...` runs it.)

if (!exists("datafile")) datafile = 'stages.dat'
if (!exists("outfile")) outfile = 'stages.png'
if (!exists("gpu")) gpu = 'H200'

# pngcairo draws smoother text; plain png (libgd) is the fallback where gnuplot lacks cairo
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1400,700 font ",10"
} else {
    set terminal png size 1400,700
}
set output outfile

set title sprintf("decode_step: one Llama-3-8B block per method, stage breakdown (%s)", gpu) noenhanced
set ylabel "microseconds"
set yrange [0:*]
set grid ytics
set key top left reverse Left noenhanced
set style data histogram
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.75 relative
# labels carry '_', '=' and '+': no enhanced-text parsing (it would subscript); rotated so ~20 cases fit
set xtics rotate by 45 right noenhanced nomirror
set bmargin 10

set lmargin 14
# columns: 1 label, 2 norms, 3 projections, 4 rope+silu, 5 attention, 6 the step timed whole (fixed by
# step_report.py). Stages on a side stream (shadowkv's value fetch, omnikv's selector) overlap the
# main stream: their bar passes the step's mark by the overlap.
plot datafile using 2:xtic(1) title "norms (rmsnorm1+2)" lc rgb "#8da0cb", \
     ''       using 3         title "projections (qkv, o, gate_up, down)" lc rgb "#66c2a5", \
     ''       using 4         title "rope + silu_mul" lc rgb "#e5c494", \
     ''       using 5         title "attention (method's path; side-stream stages stacked too)" lc rgb "#fc8d62", \
     ''       using ($0):6    with points pt 7 ps 1.2 lc rgb "#000000" title "step, timed whole (overlap included)"
