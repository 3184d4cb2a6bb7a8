# Allocation-heavy Perl for bench/real-programs: usage perl alloc.pl N.
# Hashes of arrays, string building, split/join, sort; perl uses the C
# library's malloc. Prints a checksum (keys are sorted: no hash-order effect).
use strict; use warnings;
my $n = shift or die "usage: alloc.pl N\n";
my ($total, %h) = (0);
for my $i (1 .. $n) {
    my $k = sprintf "k%05d", ($i * 7919) % 5000;
    push @{ $h{$k} }, join(",", map { $_ * $i } 1 .. ($i % 20 + 1));
    if ($i % 20000 == 0) {
        for my $key (sort keys %h) {
            my @f = split /,/, join(",", @{ $h{$key} });
            $total += @f + length $key;
        }
        %h = ();
    }
}
$total += scalar(keys %h);
print "$n $total\n";
