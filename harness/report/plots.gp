# % of ceiling per case: horizontal bars (the suite's kernel) with its in-suite impls and external
# peers as marks beside them, one panel per ceiling kind, from the plot.dat and plot_meta.gp that
# harness/report/plot_report.py writes (every number and text in the picture comes from those two files).
#   gnuplot -e "datadir='results/h200/plots'" harness/report/plots.gp      (`make plots` runs both)
# Optional: outfile (default datadir/pct_of_ceiling.png).

if (!exists("datadir")) datadir = '.'
if (!exists("outfile")) outfile = datadir.'/pct_of_ceiling.png'
datafile = datadir.'/plot.dat'
load datadir.'/plot_meta.gp'

# Layout in pixels: the picture grows with the cases (a row each) so ~100 cases stay readable; a panel
# is at least as tall as its key.
row_px = 17
head_px = 95 + 12 * |run_lines|    # the figure's title lines
panel_pad = 62   # a panel's title above and its x tics below
array panel_px[n_panels]
total_px = head_px
do for [p = 1:n_panels] {
    lines = panel_rows[p] > words(panel_cols[p]) + 2 ? panel_rows[p] : words(panel_cols[p]) + 2
    panel_px[p] = lines * row_px + panel_pad
    total_px = total_px + panel_px[p]
}
width_px = 1600

# pngcairo draws smoother text; plain png (libgd) is the fallback where gnuplot lacks cairo
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size width_px, total_px font ",9"
} else {
    set terminal png size width_px, total_px
}
set output outfile

# x to 100% and past it when a value is above (kept, never clipped: it flags a wrong ceiling)
x_max = max_pct > 100 ? 10 * ceil(max_pct * 1.06 / 10) : 110

# marks (columns 6.. of plot.dat, the panel's from plot_meta.gp): in-suite impls open, external peers filled; one colour per column, the same in every panel
colours = "#1b9e77 #d95f02 #7570b3 #e7298a #66a61e #e6ab02 #a6761d #377eb8 #e41a1c #4daf4a #984ea3 #ff7f00 #a65628 #f781bf #999999 #17becf #bcbd22 #8c564b"
open_pt = "4 6 8 10 12 14"
filled_pt = "5 7 9 11 13 15"
mark_pt(c) = col_inside[c] ? int(word(open_pt, 1 + (c - 1) % 6)) : int(word(filled_pt, 1 + (c - 1) % 6))
mark_lc(c) = word(colours, 1 + (c - 1) % words(colours))
mark_title(c) = col_inside[c] ? col_name[c].' (in-suite, own ceiling)' : col_name[c].' (external, same run)'
# a dashed rule above the first row of each family (column 2) after the panel's first
fam_prev = ""
new_family(f) = (fam_changed = (f ne fam_prev && fam_prev ne ""), fam_prev = f, fam_changed)

# runs and labels carry '_': the small lines are set apart with {/=8 ...} and '_' escaped
esc(t) = strstrt(t, "_") == 0 ? t : t[1:strstrt(t, "_") - 1]."\\_".esc(t[strstrt(t, "_") + 1:])
small(s) = "{/=8 ".esc(s)."}"
runs_text = ""
do for [i = 1:|run_lines|] { runs_text = runs_text."\n".small((i == 1 ? "runs (file, revision, date): " : "").run_lines[i]) }
title_lines = sprintf("%s: each case as %% of the ceiling it is stated against (%d cases)", esc(gpu), n_cases) \
    .runs_text \
    ."\n".small("bars: kvbench (impl=kernel, else the case's only impl), its value beside its label; open marks: the case's other impls, each on its own ceiling;") \
    ."\n".small("filled marks: external peers timed in the same run, at their own rate where their peers file gives it, else on the kernel's work (plot.dat lists which)") \
    .(n_over > 0 ? "\n".small(sprintf("%d value(s) above 100%%, drawn as measured: the ceiling, or a peer's same-work assumption, is wrong (plot.dat lists them)", n_over)) : "") \
    .(n_skipped > 0 ? "\n".small(sprintf("%d case(s) skipped with an error (plot.dat lists them)", n_skipped)) : "")
set multiplot title title_lines font ",12"

set lmargin at screen 0.27
set rmargin at screen 0.77
set xrange [0:x_max]
set format x "%g%%"
set xtics 10 nomirror
set mxtics 2
set grid xtics mxtics lc rgb "#dddddd"
set ytics nomirror scale 0 noenhanced font ",9"
set key outside right top vertical Left reverse noenhanced samplen 1.2 spacing 1.05 font ",9"
set style fill solid 0.85 noborder
set arrow 1 from 100, graph 0 to 100, graph 1 nohead lc rgb "#c00000" dt 2 lw 1.5 front

top_px = total_px - head_px
do for [p = 1:n_panels] {
    set tmargin at screen (top_px - 22.0) / total_px
    set bmargin at screen (top_px - panel_px[p] + 40.0) / total_px
    top_px = top_px - panel_px[p]
    set title panel_title[p] noenhanced offset 0, -0.6
    set yrange [panel_rows[p] - 0.5 : -0.5]    # first row on top
    fam_prev = ""
    cols = panel_cols[p]
    col_at(i) = i <= words(cols) ? int(word(cols, i)) : 6  # a for of no passes is still evaluated once
    # the suite's value goes with its label on the axis, clear of the marks near the bar's end
    plot datafile index (p - 1) using (0):0:(0):5:($0 - 0.36):($0 + 0.36):ytic(sprintf("%s   %.1f%%", strcol(1), $5)) \
             with boxxyerror lc rgb "#4c72b0" title "kvbench (suite)", \
         ''       index (p - 1) using (0):(new_family(strcol(2)) ? $0 - 0.5 : NaN):(x_max):(0) with vectors nohead lc rgb "#888888" dt 3 notitle, \
         for [i = 1:words(cols)] '' index (p - 1) using (column(col_at(i))):0 with points \
             pt mark_pt(col_at(i) - 5) ps 1.3 lw 1.5 lc rgb mark_lc(col_at(i) - 5) title mark_title(col_at(i) - 5)
}
unset multiplot
