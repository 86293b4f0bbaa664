# Sourced by close_card.sh, which runs several timed steps in one call: results collect in $R,
# each step is logged to $OUT/run.log with the seconds left, and $R is re-packed into
# $OUT/${PACK:-results}.tar.gz after each step, so a call cut short keeps what it measured.
#   left      seconds left of LIMIT (default 585) since the script started
#   cap N     N, or what is left when less (at least 5): a step's timeout
R=/tmp/r; mkdir -p $R
t0=$(date +%s)
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - t0) )); }
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $(( l > 5 ? l : 5 )) || echo "$1"; }
pack() { tar czf $OUT/${PACK:-results}.tar.gz -C $R . ; }
step() { echo "== $1 $(date +%T) (left $(left) s)" >> $OUT/run.log; }
