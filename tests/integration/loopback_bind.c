/* loopback_bind.so - LD_PRELOAD for the loopback test cluster (slurm_cluster.sh).
 *
 * Every slurmd of the test cluster runs in its own UTS namespace whose
 * hostname is its address, 127.0.0.N. Linux gives a connection to any
 * 127.x address the source 127.0.0.1, so every peer would see every node as
 * 127.0.0.1. With this library preloaded, a process whose hostname is an
 * IPv4 loopback address binds each unbound IPv4 socket to that address just
 * before it connects to a loopback destination. Then:
 *  - slurmctld 24.11+ keeps a dynamic node's NodeAddr (it takes it from the
 *    registration's source address);
 *  - srun inside a batch job (hostname 127.0.0.N, listening there because of
 *    CommunicationParameters=NoInAddrAny) is reached by slurmstepd at the
 *    address slurmd saw its launch request come from.
 * Anything else (other hostnames, non-loopback destinations, bound sockets,
 * IPv6) passes through unchanged. Test-only; a real node has its own IP.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*connect_fn)(int, const struct sockaddr*, socklen_t);

static int is_loopback(struct in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

int connect(int fd, const struct sockaddr* addr, socklen_t len) {
  static connect_fn real_connect;
  if (real_connect == NULL) real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
  if (addr != NULL && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in) &&
      is_loopback(((const struct sockaddr_in*)addr)->sin_addr)) {
    char host[256];
    struct in_addr self;
    struct sockaddr_in cur;
    socklen_t cur_len = sizeof(cur);
    int saved = errno;
    if (gethostname(host, sizeof(host)) == 0 && inet_pton(AF_INET, host, &self) == 1 &&
        is_loopback(self) && self.s_addr != htonl(INADDR_LOOPBACK) &&
        getsockname(fd, (struct sockaddr*)&cur, &cur_len) == 0 && cur.sin_family == AF_INET &&
        cur.sin_port == 0 && cur.sin_addr.s_addr == htonl(INADDR_ANY)) {
      struct sockaddr_in b;
      b.sin_family = AF_INET;
      b.sin_port = 0;
      b.sin_addr = self;
      (void)bind(fd, (const struct sockaddr*)&b, sizeof(b));
    }
    errno = saved;
  }
  return real_connect(fd, addr, len);
}
