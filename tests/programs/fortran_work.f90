! A Fortran program with known work: hot_a does twice hot_b's arithmetic
! (CPU shares about 2:1), churn allocates and frees an array of 100
! doubles N times (N calls of 800 bytes), keep leaks one array of 1000
! doubles. argv(1): N (default 200000); argv(2): rounds of hot work
! (default 300), hot_a and hot_b called in turn 50 rounds at a time (tens
! of milliseconds, long against the sampling interval, so that no period
! stays in step with the alternation), so that a machine's load falls on
! both alike; the CPU time each took goes to stderr ("fortran cpu_ns A
! B"). Built with -fno-inline: gfortran 12 has no NOINLINE attribute, and
! hot_a and hot_b must keep their own frames.
module work
  implicit none
  real(8), allocatable :: kept(:)
contains
  subroutine hot_a(rounds, s)
    integer, intent(in) :: rounds
    real(8), intent(inout) :: s
    integer :: i, j
    do j = 1, rounds
      do i = 1, 200000
        s = s + sqrt(real(i + j, 8)) * 1.0000001d0
      end do
    end do
  end subroutine hot_a

  subroutine hot_b(rounds, s)
    integer, intent(in) :: rounds
    real(8), intent(inout) :: s
    integer :: i, j
    do j = 1, rounds
      do i = 1, 100000
        s = s + sqrt(real(i + j, 8)) * 1.0000001d0
      end do
    end do
  end subroutine hot_b

  subroutine fill(a, i)
    real(8), intent(inout) :: a(:)
    integer, intent(in) :: i
    a(1 + mod(i, size(a))) = real(i, 8)
  end subroutine fill

  subroutine churn(n, s)
    integer, intent(in) :: n
    real(8), intent(inout) :: s
    real(8), allocatable :: a(:)
    integer :: i
    do i = 1, n
      allocate(a(100))
      a = 0
      call fill(a, i)
      s = s + sum(a)
      deallocate(a)
    end do
  end subroutine churn

  subroutine keep()
    allocate(kept(1000))
    kept = 1
  end subroutine keep
end module work

program main
  use work
  implicit none
  integer :: n, rounds
  character(len=32) :: arg
  real(8) :: s, t0, t1, ta, tb
  integer :: j
  ! Rounds of hot work per call (see the top of the file).
  integer, parameter :: chunk = 50
  n = 200000
  rounds = 300
  if (command_argument_count() >= 1) then
    call get_command_argument(1, arg)
    read (arg, *) n
  end if
  if (command_argument_count() >= 2) then
    call get_command_argument(2, arg)
    read (arg, *) rounds
  end if
  s = 0
  call churn(n, s)
  call keep()
  ta = 0
  tb = 0
  do j = 1, rounds, chunk
    call cpu_time(t0)
    call hot_a(min(chunk, rounds - j + 1), s)
    call cpu_time(t1)
    ta = ta + (t1 - t0)
    call hot_b(min(chunk, rounds - j + 1), s)
    call cpu_time(t0)
    tb = tb + (t0 - t1)
  end do
  print '(a, i0, a, l1)', 'fortran done ', n, ' ', s > 0
  write (0, '(a, i0, a, i0)') 'fortran cpu_ns ', nint(ta * 1d9, 8), ' ', nint(tb * 1d9, 8)
end program main
