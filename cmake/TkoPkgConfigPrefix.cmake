# SPDX-License-Identifier: MIT
# Install-time half of tko_install_pkgconfig (cmake/TkoPkgConfig.cmake):
# writes TKO_PC_OUT from TKO_PC_TEMPLATE with the prefix line for the
# prefix this install goes to (CMAKE_INSTALL_PREFIX, without DESTDIR).
string(REGEX REPLACE "(.)/+$" "\\1" prefix "${CMAKE_INSTALL_PREFIX}")
set(relocatable ${TKO_PC_RELOCATABLE})
if(relocatable STREQUAL "AUTO")
  if(prefix MATCHES "^/usr(/local)?$")
    set(relocatable OFF)
  else()
    set(relocatable ON)
  endif()
endif()
if(relocatable)
  set(TKO_PC_PREFIX "\${pcfiledir}/${TKO_PC_UP}")
else()
  set(TKO_PC_PREFIX "${prefix}")
endif()
configure_file("${TKO_PC_TEMPLATE}" "${TKO_PC_OUT}" @ONLY)
