# The balancing experiment's plots (bench/balancing/run.sh): loss and mean max violation per step
# for the three methods, from summarise.py's OUT/<method>.tsv.
# usage: gnuplot -e "dir='OUT'" plots.gp
set terminal pngcairo size 900,720 font ",11" noenhanced
set grid
set key top right
files = "none aux_loss quantile"
colours = "#d62728 #1f77b4 #2ca02c"

# The three curves lie on top of each other at this scale, so the lower panel shows each run's
# loss minus the unbalanced run's at the same step (the runs see the same batches).
set output dir."/balancing_loss.png"
set multiplot layout 2,1
set title "Training loss (cross-entropy; thin: per step, thick: 20-step mean)"
set ylabel "loss (nats per byte)"
set format x ""
tsv(i) = dir."/".word(files,i).".tsv"
plot for [i=1:3] tsv(i) using 1:2 with lines lw 0.5 lc rgb word(colours,i) notitle, \
     for [i=1:3] tsv(i) using 1:8 with lines lw 2.5 lc rgb word(colours,i) title word(files,i)
set title "Loss minus the run without balancing at the same step (20-step mean)"
set ylabel "loss difference"
set xlabel "step"
set format x "%g"
plot for [i=1:3] tsv(i) using 1:10 with lines lw 2 lc rgb word(colours,i) title word(files,i)
unset multiplot

set output dir."/balancing_violation.png"
set terminal pngcairo size 900,520 font ",11" noenhanced
set title "Max violation (max load - mean) / mean, averaged over the 4 MoE layers"
set ylabel "max violation"
set xlabel "step"
set logscale y
plot for [i=1:3] tsv(i) using 1:3 with lines lw 0.5 lc rgb word(colours,i) notitle, \
     for [i=1:3] tsv(i) using 1:9 with lines lw 2.5 lc rgb word(colours,i) title word(files,i)
