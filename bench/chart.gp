# chart.gp -- the bench chart: four panels from one run's .dat files (see bench/report.py).
# gnuplot -e "dir='OUT'; out='OUT/bench.png'" bench/chart.gp
set terminal pngcairo size 1400,1000 font "sans,10"
set output out
set multiplot layout 2,2 title "celeriac vs Python Celery 5 (same machine, same run)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set key top right

set title "1. Dispatch, tasks/s (log scale)"
set logscale y
set yrange [10:*]
set xtics rotate by -20
plot dir."/dispatch.dat" using 2:xtic(1) title "celery.accumulate", \
     "" using 3 title "llm.generate, 0 ms LLM"
unset logscale y

set title "2. 10,000 LLM tasks of 1 s: wall time, s (log scale)"
set logscale y
set yrange [0.5:*]
plot dir."/conc.dat" using 2:xtic(1) title "measured", "" using 3 title "ideal N x 1 s / c"
unset logscale y

set title "3. celeriac peak RSS with N streams in flight, MB"
set style data linespoints
set xtics norotate
set yrange [0:*]
set xlabel "streams in flight"
plot dir."/mem.dat" using 1:2 title "celeriac peak RSS" lw 2 pt 7, \
     "" using 1:3 title "idle + bare libcurl floor per stream" lw 2 dt 2, \
     "" using 1:(16*$1/1024.0) title "target: 16 KB per stream" lw 1 dt 3
unset xlabel

set title "4. Round trip of a trivial task, ms"
set key top left
set style data histograms
set xtics rotate by -20
plot dir."/latency.dat" using 2:xtic(1) title "p50", "" using 3 title "p99"
unset multiplot
