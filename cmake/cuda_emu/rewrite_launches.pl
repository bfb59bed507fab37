#!/usr/bin/perl
# The CUDA emulator's front end: rewrites a .cu file into host C++ for the
# host compiler (cmake/cuda_emu/include/cuda_runtime.h has the rest).
#   kernel<<<grid, block, smem, stream>>>(args)  ->  ::cuda_emu::Bind(kernel, grid, block, smem, stream)(args)
#   extern __shared__ T name[];                    ->  T* name = (the launch's dynamic shared memory)
# Usage: rewrite_launches.pl IN.cu OUT.cc
use strict;
use warnings;

my ($in, $out) = @ARGV;
die "usage: rewrite_launches.pl IN.cu OUT.cc\n" unless defined $out;
open(my $fh, '<', $in) or die "$in: $!\n";
my $s = do { local $/; <$fh> };
close($fh);

$s =~ s/\bextern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;/$1* $2 = static_cast<$1*>(::cuda_emu::DynamicShared());/g;
$s =~ s/([A-Za-z_][\w:]*(?:<[^<>;{}()]*>)?)\s*<<<(.*?)>>>\s*\(/::cuda_emu::Bind($1, $2)(/gs;
die "$in: a kernel launch the emulator cannot rewrite is left\n" if $s =~ /<<<|>>>/;

open(my $oh, '>', "$out.tmp") or die "$out: $!\n";
print $oh "#line 1 \"$in\"\n", $s;
close($oh) or die "$out: $!\n";
rename("$out.tmp", $out) or die "$out: $!\n";
